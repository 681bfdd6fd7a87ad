"""Which posterior a classifier fits (``method`` and ``covariance`` resolved from "auto", the
CEP variants) and how an unconverged fit's cause is explained."""

from ..engines.glm import CEP, PAPER_CEP

__all__ = ["FULL_AUTO_FEATURES", "CEP_VARIANTS", "choose_inference", "LARGE_PRIOR_VARIANCE", "large_variance_cause"]

#: ``covariance="auto"`` takes the full covariance up to this many weights (intercept included).
#: A full-covariance EP sweep costs ~2 n d² multiply-adds at the matrix-product rate and holds
#: O(d²) numbers; a factorized one ~n d likelihood evaluations and 2 n d stored sites.  Full EP
#: converges in 3–6 sweeps where CEP-1 takes its EP warm-up and 4–60 of its own, and it is
#: close to the exact posterior (KL(NUTS ‖ q) 0.006–0.16 nats on the CEP paper's sets, against
#: 6–48 for the factorized q).  Measured on 100,000 rows (benchmarks/results/scale.md): full EP
#: is the cheaper fit up to d ≈ 500, and its covariance is then 2 MiB against 800 MB of sites.
FULL_AUTO_FEATURES = 512

#: The engine's CEP settings of each ``cep_variant``: the library's guarded CEP (EP warm-up,
#: EP's moments blended in beyond CEP's expansion range, damping probe) and the paper's.
CEP_VARIANTS = {"guarded": CEP, "paper": PAPER_CEP}


def choose_inference(method, covariance, dim):
    """``method`` and ``covariance`` with ``"auto"`` resolved for ``dim`` weights.

    | method | covariance | dim ≤ FULL_AUTO_FEATURES | beyond |
    |---|---|---|---|
    | auto | auto | ep, full | cep1, diagonal |
    | ep / cep1 / cep2 / kjit | auto | that method, diagonal | that method, diagonal |
    | auto | full | ep, full | ep, full |
    | auto | diagonal | cep1, diagonal | cep1, diagonal |

    A method named by the user keeps the factorized posterior it has always fitted (only
    ``covariance="full"`` asks for the full form: EP's, or CEP's with ``"cep1"`` / ``"cep2"``).
    The factorized default is CEP-1: its conditional moments are closer to the exact
    posterior's than factorized EP's on the CEP paper's sets
    (benchmarks/results/classification.md).
    """
    if covariance == "auto":
        covariance = "full" if method == "auto" and dim <= FULL_AUTO_FEATURES else "diagonal"
    if method == "auto":
        method = "ep" if covariance == "full" else "cep1"
    return method, covariance


#: A prior variance chosen by the evidence above this, for a fit that did not converge, is
#: named as the likely cause: on (nearly) separable classes the evidence keeps rising with λ
#: and EP creeps along the separating direction (measured, the crabs data standardised, probit
#: EP at tol 1e-3: 57 sweeps at λ = 1, 300 at e⁵, more beyond).
LARGE_PRIOR_VARIANCE = 100.0


def large_variance_cause(results):
    """The cause of an unconverged fit that the λ search explains, or None."""
    chosen = [r.prior_variance for r in results if not r.converged and r.prior_variance]
    if not chosen or max(chosen) <= LARGE_PRIOR_VARIANCE:
        return None
    return (
        f"the evidence chose prior_variance {max(chosen):.3g}: the classes may be "
        "(nearly) separable, where the evidence keeps rising with the prior variance and "
        "EP moves slowly along the separating direction; pass a number as prior_variance "
        "(e.g. 100.0) for a fit that converges sooner, or increase max_iter"
    )
