"""kiln.distributions: torch.distributions' everyday subset, written with Kiln's tensor ops, so values and
gradients (rsample's, log_prob's with respect to the parameters) go through Kiln's autograd, on the CPU
and on CUDA. Samples come from Kiln's random stream (kiln.manual_seed makes them reproducible);
sample() is taken outside autograd, rsample() is differentiable where has_rsample.

    Normal, LogNormal, Uniform, Exponential, Laplace, Cauchy, Gumbel      (rsample, cdf, icdf)
    HalfNormal, HalfCauchy, Pareto, Weibull, LogisticNormal               (TransformedDistributions)
    ContinuousBernoulli                                                   (probs= or logits=, rsample)
    Gamma, Chi2, Beta, Dirichlet, StudentT                                (rsample: gamma.py's docstring)
    Poisson, Binomial, NegativeBinomial, Multinomial                      (sample, no rsample)
    MultivariateNormal                          (covariance_matrix=, precision_matrix= or scale_tril=; rsample)
    LowRankMultivariateNormal                   (loc, cov_factor, cov_diag; rsample)
    Bernoulli, Geometric, Categorical, OneHotCategorical                  (probs= or logits=)
    Independent, RelaxedBernoulli, RelaxedOneHotCategorical             (rsample, log_prob)
    TransformedDistribution; transforms (ExpTransform, AffineTransform, SigmoidTransform, TanhTransform,
    SoftplusTransform, PowerTransform, AbsTransform, SoftmaxTransform, StickBreakingTransform,
    ReshapeTransform, IndependentTransform, ComposeTransform, CatTransform, StackTransform);
    biject_to, transform_to; kl_divergence, register_kl; constraints; Distribution

Left out (not yet written): Kumaraswamy,
the Cholesky transforms, LogitRelaxedBernoulli/ExpRelaxedCategorical and the mixtures; the Gamma family's
cdf/icdf (no incomplete gamma op).
"""
from . import constraints
from .constraints import Constraint
from .distribution import Distribution
from .continuous import Normal, LogNormal, Uniform, Exponential, Laplace, Cauchy, Gumbel
from .discrete import Bernoulli, Geometric, Categorical, OneHotCategorical
from .independent import Independent
from .relaxed import RelaxedBernoulli, RelaxedOneHotCategorical
from . import transforms, constraint_registry
from .transforms import (AbsTransform, AffineTransform, CatTransform, ComposeTransform, ExpTransform,
                         IndependentTransform, PowerTransform, ReshapeTransform, SigmoidTransform, SoftmaxTransform,
                         SoftplusTransform, StackTransform, StickBreakingTransform, TanhTransform, Transform,
                         identity_transform)
from .constraint_registry import biject_to, transform_to
from .transformed_distribution import TransformedDistribution
from .transformed import HalfNormal, HalfCauchy, Pareto, Weibull, LogisticNormal
from .continuous_bernoulli import ContinuousBernoulli
from .gamma import Gamma, Chi2, Beta, Dirichlet, StudentT
from .counts import Poisson, Binomial, NegativeBinomial, Multinomial
from .multivariate_normal import MultivariateNormal, LowRankMultivariateNormal
from .kl import kl_divergence, register_kl

__all__ = ["constraints", "Constraint", "Distribution", "Normal", "LogNormal", "Uniform", "Exponential", "Laplace",
           "Cauchy", "Gumbel", "Bernoulli", "Geometric", "Categorical", "OneHotCategorical", "Independent",
           "RelaxedBernoulli", "RelaxedOneHotCategorical", "kl_divergence", "register_kl", "transforms",
           "Transform", "ComposeTransform", "IndependentTransform", "ReshapeTransform", "ExpTransform",
           "PowerTransform", "SigmoidTransform", "SoftplusTransform", "TanhTransform", "AbsTransform",
           "AffineTransform", "SoftmaxTransform", "StickBreakingTransform", "CatTransform", "StackTransform",
           "identity_transform", "biject_to", "transform_to", "TransformedDistribution", "HalfNormal",
           "HalfCauchy", "Pareto", "Weibull", "LogisticNormal", "ContinuousBernoulli", "Gamma", "Chi2", "Beta", "Dirichlet",
           "StudentT", "Poisson", "Binomial", "NegativeBinomial", "MultivariateNormal",
           "Multinomial", "LowRankMultivariateNormal"]
