"""Where samples come from: the kernel (perf events, packet hooks, stack maps, the
LBR modes and their probe) and the mock source (with synthetic branch stacks); the
PMU event specs that --events names."""
