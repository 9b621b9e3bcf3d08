# SPDX-License-Identifier: Apache-2.0
"""GPU timing shared by the bench scripts (run on the GPU machine)."""
import statistics

import torch


def graph_ms(fn, reps: int = 20) -> float:
    """Median GPU time in ms of fn() replayed as a CUDA graph (launch overhead excluded): two
    warm-up calls on a side stream, one capture, then `reps` replays timed with CUDA events."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)
