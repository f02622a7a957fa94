"""Lossless verification of draft trees on the target model (torch): packing and the
greedy/sampled acceptance walk."""
