"""Plain data shared by every layer: sample and packet records (their dtypes from
the BPF object), flow keys and names, frames, rollups, interference classes and the
flush window. Imports nothing else of sentinel."""
