"""The drafting core: parameters, the batched drafter over the native core, token checks."""
