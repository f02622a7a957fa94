"""Benchmarks of the drafter (``drafter-bench``): greedy replay of recorded outputs.

``replay`` measures tokens per step (tau) and drafting latency of SSSD drafting
(input trie, datastore, both) against prompt lookup (vLLM ``ngram``).
"""
