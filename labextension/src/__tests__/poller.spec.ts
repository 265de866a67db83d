import { Poller } from '../poller';

const settle = async () => {
  for (let i = 0; i < 5; i++) {
    await Promise.resolve();
  }
};

beforeEach(() => jest.useFakeTimers());
afterEach(() => jest.useRealTimers());

describe('Poller', () => {
  it('ticks at once, then every interval, and backs off while the tick fails', async () => {
    let fail = false;
    const tick = jest.fn(async () => {
      if (fail) {
        throw new Error('down');
      }
    });
    const poller = new Poller(tick, 2000, { jitter: 0 });
    poller.start();
    jest.advanceTimersByTime(0);
    await settle();
    expect(tick).toHaveBeenCalledTimes(1);
    fail = true;
    jest.advanceTimersByTime(2000); // 2: fails
    await settle();
    jest.advanceTimersByTime(1000); // 3: after 1 s; fails
    await settle();
    expect(tick).toHaveBeenCalledTimes(3);
    jest.advanceTimersByTime(1999); // next after 2 s
    await settle();
    expect(tick).toHaveBeenCalledTimes(3);
    fail = false;
    jest.advanceTimersByTime(1); // 4: succeeds, back to the interval
    await settle();
    jest.advanceTimersByTime(2000);
    await settle();
    expect(tick).toHaveBeenCalledTimes(5);
    poller.stop();
    jest.advanceTimersByTime(60_000);
    await settle();
    expect(tick).toHaveBeenCalledTimes(5);
  });

  it('runs one loop after a stop and start during a tick', async () => {
    const pending: (() => void)[] = [];
    const tick = jest.fn(() => new Promise<void>(resolve => pending.push(resolve)));
    const poller = new Poller(tick, 1000);
    poller.start();
    jest.advanceTimersByTime(0); // tick 1 in flight
    poller.stop();
    poller.start();
    jest.advanceTimersByTime(0); // tick 2 in flight
    pending.splice(0).forEach(resolve => resolve());
    await settle();
    jest.advanceTimersByTime(1000); // one tick 3, not two
    await settle();
    expect(tick).toHaveBeenCalledTimes(3);
    pending.splice(0).forEach(resolve => resolve());
    await settle();
    jest.advanceTimersByTime(1000);
    expect(tick).toHaveBeenCalledTimes(4);
    poller.stop();
  });
});
