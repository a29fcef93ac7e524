"""Addresses to names: ELF symbols and lines, kallsyms, perf maps of JIT code, the
/proc views of processes and their mappings, bounded caches."""
