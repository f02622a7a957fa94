"""The reference decode worker: a batched speculative decode loop over a ``transformers``
model, drafting through the client and verifying losslessly (``drafter-worker``)."""
