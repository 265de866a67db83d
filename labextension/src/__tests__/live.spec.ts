import { FeedState, LiveFeed } from '../live';

class FakeSocket {
  static all: FakeSocket[] = [];
  onopen: (() => void) | null = null;
  onmessage: ((event: { data: string }) => void) | null = null;
  onclose: ((event: { code: number; reason: string }) => void) | null = null;
  closed = false;

  constructor(readonly url: string) {
    FakeSocket.all.push(this);
  }
  open() {
    this.onopen?.();
  }
  send(data: unknown) {
    this.onmessage?.({ data: JSON.stringify(data) });
  }
  drop(code: number, reason = '') {
    this.onclose?.({ code, reason });
  }
  close() {
    this.closed = true;
  }
  static last(): FakeSocket {
    return FakeSocket.all[FakeSocket.all.length - 1];
  }
}

function feed(poll: () => Promise<boolean>) {
  const received: unknown[] = [];
  const states: [FeedState, string | undefined][] = [];
  let n = 0;
  const live = new LiveFeed({
    url: () => `ws://x/feed?n=${n++}`,
    receive: data => received.push(data),
    poll,
    onState: (state, detail) => states.push([state, detail]),
    pollIntervalMs: 2000,
    backoff: { jitter: 0 },
    WebSocket: FakeSocket as any
  });
  return { live, received, states };
}

const settle = async () => {
  for (let i = 0; i < 5; i++) {
    await Promise.resolve();
  }
};

beforeEach(() => {
  jest.useFakeTimers();
  FakeSocket.all = [];
});

afterEach(() => jest.useRealTimers());

describe('LiveFeed', () => {
  it('delivers the socket messages while it is live', () => {
    const poll = jest.fn(async () => false);
    const { live, received, states } = feed(poll);
    live.start();
    FakeSocket.last().open();
    FakeSocket.last().send({ items: [] });
    expect(received).toEqual([{ items: [] }]);
    expect(states.map(s => s[0])).toEqual(['connecting', 'live']);
    expect(poll).not.toHaveBeenCalled();
  });

  it('polls while the socket is down and reconnects with backoff; a fresh URL each time', async () => {
    const poll = jest.fn(async () => false);
    const { live, states } = feed(poll);
    live.start();
    FakeSocket.last().drop(1006);
    expect(live.state).toBe('polling');
    expect(states[states.length - 1]).toEqual(['polling', 'websocket closed (1006)']);
    jest.advanceTimersByTime(0);
    await settle();
    expect(poll).toHaveBeenCalledTimes(1); // at once

    jest.advanceTimersByTime(1000); // first reconnect after 1 s
    expect(FakeSocket.all).toHaveLength(2);
    expect(FakeSocket.last().url).toBe('ws://x/feed?n=1');
    FakeSocket.last().drop(1006); // refused again: next try after 2 s
    jest.advanceTimersByTime(1000);
    await settle();
    expect(FakeSocket.all).toHaveLength(2);
    jest.advanceTimersByTime(1000);
    await settle();
    expect(FakeSocket.all).toHaveLength(3);
    expect(poll).toHaveBeenCalledTimes(2); // polled again 2 s after the first poll

    FakeSocket.last().open(); // back: polling stops
    expect(live.state).toBe('live');
    jest.advanceTimersByTime(60_000);
    await settle();
    expect(poll).toHaveBeenCalledTimes(2);
  });

  it('backs the polling off while it fails', async () => {
    const poll = jest.fn(async (): Promise<boolean> => {
      throw new Error('502 control plane unreachable');
    });
    const { live, states } = feed(poll);
    live.start();
    FakeSocket.last().drop(4502, 'cannot reach the control plane');
    const times: number[] = [];
    for (let t = 0; t <= 8000; t += 250) {
      const before = poll.mock.calls.length;
      jest.advanceTimersByTime(t === 0 ? 0 : 250);
      await settle();
      if (poll.mock.calls.length > before) {
        times.push(t);
      }
      // keep refusing the socket, so the feed stays on polling
      const socket = FakeSocket.last();
      if (!socket.closed && socket.onclose && FakeSocket.all.length > 1 && !(socket as any).dropped) {
        (socket as any).dropped = true;
        socket.drop(1006);
      }
    }
    expect(times).toEqual([0, 1000, 3000, 7000]);
    expect(states).toContainEqual(['polling', '502 control plane unreachable']);
    live.stop();
  });

  it('is finished when the socket closes normally, or a poll says so', async () => {
    const { live, states } = feed(async () => true);
    live.start();
    FakeSocket.last().open();
    FakeSocket.last().drop(1000, 'the log is complete');
    expect(live.state).toBe('finished');
    expect(states[states.length - 1]).toEqual(['finished', 'the log is complete']);

    live.start();
    FakeSocket.last().drop(1006);
    jest.advanceTimersByTime(0);
    await settle();
    expect(live.state).toBe('finished');
    jest.advanceTimersByTime(60_000);
    expect(FakeSocket.all).toHaveLength(2); // no reconnect after the end
  });

  it('stops every timer and closes the socket', async () => {
    const poll = jest.fn(async () => false);
    const { live } = feed(poll);
    live.start();
    const socket = FakeSocket.last();
    live.stop();
    expect(socket.closed).toBe(true);
    socket.drop(1006); // the close event of a stopped feed changes nothing
    jest.advanceTimersByTime(60_000);
    await settle();
    expect(poll).not.toHaveBeenCalled();
    expect(live.state).toBe('stopped');
  });
});
