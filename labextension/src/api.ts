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

/** The JSON body of a successful GET on a control-plane path, read off the generated schema. */
export type GetResponse<P extends keyof paths> = paths[P] extends {
  get: { responses: { 200: { content: { 'application/json': infer R } } } };
}
  ? R
  : never;

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

/**
 * GET a control-plane path (e.g. `/api/whoami`) as the logged-in user.
 * The server extension adds its hub token; the browser session authenticates to it.
 */
export async function get<P extends keyof paths>(
  path: P,
  query: Record<string, string> = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<GetResponse<P>> {
  const search = new URLSearchParams(query).toString();
  const url =
    URLExt.join(settings.baseUrl, 'cellscale', path) +
    (search ? `?${search}` : '');
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, {}, settings);
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
  return body as GetResponse<P>;
}

export function whoami(): Promise<WhoAmI> {
  return get('/api/whoami');
}
