/**
 * Calls to the control plane, through the server extension's relay (`/cellscale/api/...`).
 *
 * Every body type comes from `generated/api.ts`, which `scripts/gen-api-types` generates from
 * the control plane's OpenAPI schema: never redeclare an API object here.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { components, paths } from './generated/api';

export type Schemas = components['schemas'];
export type WhoAmI = Schemas['WhoAmI'];
export type JobView = Schemas['JobView'];
export type JobPage = Schemas['JobPage'];
export type Phase = Schemas['Phase'];
export type EventView = Schemas['EventView'];
export type CheckpointView = Schemas['CheckpointView'];
export type LogChunk = Schemas['LogChunk'];
export type RenderView = Schemas['RenderView'];
export type QueueUsage = Schemas['QueueUsage'];
export type BudgetView = Schemas['BudgetView'];
export type JobQuery = NonNullable<paths['/api/jobs']['get']['parameters']['query']>;
export type SweepProgress = Schemas['SweepProgress'];
export type PointView = Schemas['PointView'];
export type PointPage = Schemas['PointPage'];
export type PointStatus = Schemas['PointStatus'];
export type Origin = Schemas['Origin'];
export type PointQuery = NonNullable<paths['/api/jobs/{job_id}/points']['get']['parameters']['query']>;

/** The JSON body of a successful GET on a control-plane path, read off the generated schema. */
export type GetResponse<P extends keyof paths> = paths[P] extends {
  get: { responses: { 200: { content: { 'application/json': infer R } } } };
}
  ? R
  : never;

/** The JSON body of a successful POST on a control-plane path. */
export type PostResponse<P extends keyof paths> = paths[P] extends {
  post: { responses: { 200: { content: { 'application/json': infer R } } } };
}
  ? R
  : never;

type Query = Record<string, string | number | boolean | null | undefined>;

/** A refusal from the relay or the control plane, with the reason it gave. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

/** `/api/jobs/{job_id}` with its parameters filled in (each one URL-encoded). */
export function fillPath(path: string, params: Record<string, string> = {}): string {
  return path.replace(/\{(\w+)\}/g, (_, name: string) => {
    if (!(name in params)) {
      throw new Error(`no value for {${name}} in ${path}`);
    }
    return encodeURIComponent(params[name]);
  });
}

/** `?a=1&b=x` from the values that are set (null, undefined and '' are left out). */
export function queryString(query: Query = {}): string {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) {
    if (value !== null && value !== undefined && value !== '') {
      search.set(key, String(value));
    }
  }
  const text = search.toString();
  return text ? `?${text}` : '';
}

async function request(
  method: 'GET' | 'POST',
  path: string,
  query: Query,
  settings: ServerConnection.ISettings
): Promise<any> {
  const url = URLExt.join(settings.baseUrl, 'cellscale', path) + queryString(query);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, { method }, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let body: any = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!response.ok) {
    // FastAPI says {"detail": ...}; jupyter-server's own errors say {"message": ...}
    const reason = body?.detail ?? body?.message ?? (text || response.statusText);
    throw new ApiError(
      response.status,
      typeof reason === 'string' ? reason : JSON.stringify(reason)
    );
  }
  return body;
}

/**
 * GET a control-plane path (e.g. `/api/jobs/{job_id}`) as the logged-in user.
 * The server extension adds its hub token; the browser session authenticates to it.
 */
export function get<P extends keyof paths>(
  path: P,
  options: { params?: Record<string, string>; query?: Query } = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<GetResponse<P>> {
  return request('GET', fillPath(path, options.params), options.query ?? {}, settings);
}

export function post<P extends keyof paths>(
  path: P,
  options: { params?: Record<string, string> } = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<PostResponse<P>> {
  return request('POST', fillPath(path, options.params), {}, settings);
}

/** The websocket URL of one of the relay's live feeds (`/api/jobs/ws`, `/api/jobs/{id}/logs/ws`). */
export function socketUrl(
  path: string,
  query: Query = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): string {
  const url = URLExt.join(settings.wsUrl, 'cellscale', path) + queryString(query);
  // a server that authenticates by token (not by cookie) takes it on the URL for websockets
  return settings.token && settings.appendToken
    ? url + (url.includes('?') ? '&' : '?') + `token=${encodeURIComponent(settings.token)}`
    : url;
}

export const whoami = (): Promise<WhoAmI> => get('/api/whoami');
export const quota = (): Promise<QueueUsage[]> => get('/api/quota');
export const budgets = (): Promise<BudgetView[]> => get('/api/budgets');
export const listJobs = (query: JobQuery): Promise<JobPage> =>
  get('/api/jobs', { query });
export const getJob = (id: string): Promise<JobView> =>
  get('/api/jobs/{job_id}', { params: { job_id: id } });
export const jobEvents = (id: string, after = 0): Promise<EventView[]> =>
  get('/api/jobs/{job_id}/events', { params: { job_id: id }, query: { after } });
export const jobCheckpoints = (id: string): Promise<CheckpointView[]> =>
  get('/api/jobs/{job_id}/checkpoints', { params: { job_id: id } });
export const jobRender = (id: string): Promise<RenderView> =>
  get('/api/jobs/{job_id}/render', { params: { job_id: id } });
export const cancelJob = (id: string): Promise<JobView> =>
  post('/api/jobs/{job_id}/cancel', { params: { job_id: id } });
/** A page of a sweep's points (in index order from `offset`; only `status`; changed after `since`). */
export const jobPoints = (id: string, query: PointQuery = {}): Promise<PointPage> =>
  get('/api/jobs/{job_id}/points', { params: { job_id: id }, query });
/** One slice of the log (the fallback while its websocket is down). */
export const logChunk = (id: string, offset: number): Promise<LogChunk> =>
  get('/api/jobs/{job_id}/logs', { params: { job_id: id }, query: { offset } });
