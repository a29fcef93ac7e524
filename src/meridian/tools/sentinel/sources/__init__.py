"""Where samples come from: the kernel (perf events, packet hooks, stack maps) and
the mock source; the PMU event specs that --events names."""
