"""Workloads shared by the benchmark client (`superinfer bench`) and the simulator
(`superinfer simulate`): datasets and length limits (`datasets`), arrival processes
(`arrivals`), the workload configuration (`config`) and the tokenizer that counts prompt
tokens (`tokenizer`). Imports neither `bench` nor `sim`."""
