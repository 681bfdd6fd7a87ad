r"""Streaming Bayesian deep tensor factorization (SBDT): one-pass assumed density filtering over
a Bayesian neural network on the entries' embeddings, with spike-and-slab weights.

Fang, Wang, Pan, Liu and Zhe, "Streaming Bayesian Deep Tensor Factorization", ICML 2021
("the paper"; "the supplement" is its supplementary material): the model of §3, the ADF
moment update (eq. 7), the delta method (eqs. 8–9), the running evidence (eqs. 10, 12) and
Alg. 1; the noise update (supplement §1) and the spike-and-slab EP step (supplement §2,
eqs. 5–9).  Beyond the paper: a global offset, ordinal entries and implicit feedback (SVD++).

The engine's one step folds a batch into the posterior, updating it in place:
``absorb_batch(post, X, y, likelihood, damping)`` (Alg. 1 lines 3–9); a stream is the loop
``for batch in batches: post = absorb_batch(post, *batch, likelihood, damping)``.  A pass over
entries held in chunks (in memory or on Dask workers) folds that loop over the chunks in order
through a holder (:class:`EntryChunks`, ``holder.fold(step, state)``).

Modules:

* :mod:`.posterior` — the model, the factorized posterior ``DeepPosterior``, its start and
  growth, the network inputs of entries, the buffers of the compiled pass (``Workspace``);
* :mod:`.implicit` — implicit feedback: the sets N(s) and the vectors y (``ImplicitFeedback``);
* :mod:`.moments` — the delta method over many entries (eqs. 8–9), the running evidence log Z;
* :mod:`.thresholds` — the cut points of ordinal entries: their start and their refit per batch;
* :mod:`.spike_slab` — the EP step of the spike-and-slab terms (supplement eqs. 5–9);
* :mod:`.adf` — ADF over a batch's entries (Alg. 1 lines 3–8), the step ``absorb_batch`` and the
  running evidence batch by batch (``evidence_per_batch``);
* :mod:`.chunks` — a stream's entries in chunks folded in order: the holder protocol ``EntryChunks``
  and its single-machine ``InMemoryChunks``;
* ``_kernel`` — the compiled per-entry loop (numba): delta method, evidence, eq. 7, noise.
"""

from .adf import absorb_batch, absorb_summary, evidence_per_batch
from .chunks import EntryChunks, InMemoryChunks
from .moments import predict_moments
from .posterior import DeepPosterior, grow_posterior, init_posterior
from .thresholds import initial_thresholds

__all__ = [
    "DeepPosterior",
    "init_posterior",
    "grow_posterior",
    "predict_moments",
    "initial_thresholds",
    "absorb_batch",
    "absorb_summary",
    "evidence_per_batch",
    "EntryChunks",
    "InMemoryChunks",
]
