"""Trio cost of one memory-channel hop per item (send_nowait, a task wakes, receives), in
CPU microseconds: one hop, then two (through a relay task)."""
import trio, time
N = 20000
async def main():
    s, r = trio.open_memory_channel(100000)
    s2, r2 = trio.open_memory_channel(100000)
    async def relay():
        async for x in r:
            await s2.send(x)
    async def sink():
        async for x in r2:
            pass
    async with trio.open_nursery() as n:
        n.start_soon(sink)
        t0 = time.thread_time()
        for i in range(N):
            s2.send_nowait(i)
            await trio.lowlevel.checkpoint()
        t1 = time.thread_time()
        n.start_soon(relay)
        for i in range(N):
            s.send_nowait(i)
            await trio.lowlevel.checkpoint()
        t2 = time.thread_time()
        print(f"one hop: {1e6*(t1-t0)/N:.1f} us/item, two hops: {1e6*(t2-t1)/N:.1f} us/item")
        n.cancel_scope.cancel()
trio.run(main)
