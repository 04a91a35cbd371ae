"""kl_divergence(p, q) and register_kl, as torch's: the most specific registered pair of types wins;
an unregistered pair is a NotImplementedError."""
import math
import warnings
from functools import total_ordering

from .. import _C
from .continuous import Cauchy, Exponential, Gumbel, Laplace, LogNormal, Normal, Uniform
from .continuous_bernoulli import ContinuousBernoulli
from .discrete import Bernoulli, Categorical, Geometric, OneHotCategorical
from .distribution import Distribution
from .independent import Independent
from .transformed import HalfNormal, Pareto
from .transformed_distribution import TransformedDistribution
from .transforms import ExpTransform
from .utils import EULER_GAMMA, sum_rightmost
from .gamma import Beta, Dirichlet, Gamma
from .counts import Binomial, Poisson
from .multivariate_normal import MultivariateNormal, _batch_mahalanobis

__all__ = ["kl_divergence", "register_kl"]

_KL_REGISTRY = {}
_KL_MEMOIZE = {}


def register_kl(type_p, type_q):
    """Decorator registering fn(p, q) as KL(p || q) for p of type_p and q of type_q (or subclasses)."""
    if not isinstance(type_p, type) or not issubclass(type_p, Distribution):
        raise TypeError(f"Expected type_p to be a Distribution subclass but got {type_p}")
    if not isinstance(type_q, type) or not issubclass(type_q, Distribution):
        raise TypeError(f"Expected type_q to be a Distribution subclass but got {type_q}")

    def decorator(fun):
        _KL_REGISTRY[type_p, type_q] = fun
        _KL_MEMOIZE.clear()
        return fun

    return decorator


@total_ordering
class _Match:
    def __init__(self, *types):
        self.types = types

    def __eq__(self, other):
        return self.types == other.types

    def __le__(self, other):
        for x, y in zip(self.types, other.types):
            if not issubclass(x, y):
                return False
            if x is not y:
                break
        return True


def _dispatch_kl(type_p, type_q):
    matches = [(sp, sq) for sp, sq in _KL_REGISTRY if issubclass(type_p, sp) and issubclass(type_q, sq)]
    if not matches:
        return NotImplemented
    left_p, left_q = min(_Match(*m) for m in matches).types
    right_q, right_p = min(_Match(*reversed(m)) for m in matches).types
    left_fun, right_fun = _KL_REGISTRY[left_p, left_q], _KL_REGISTRY[right_p, right_q]
    if left_fun is not right_fun:
        warnings.warn(f"Ambiguous kl_divergence({type_p.__name__}, {type_q.__name__}). "
                      f"Please register_kl({left_p.__name__}, {right_q.__name__})", RuntimeWarning, stacklevel=2)
    return left_fun


def kl_divergence(p, q):
    """KL(p || q), of shape batch_shape, for a registered pair of distribution types."""
    try:
        fun = _KL_MEMOIZE[type(p), type(q)]
    except KeyError:
        fun = _dispatch_kl(type(p), type(q))
        _KL_MEMOIZE[type(p), type(q)] = fun
    if fun is NotImplemented:
        raise NotImplementedError(f"No KL(p || q) is implemented for p type {p.__class__.__name__} and q type "
                                  f"{q.__class__.__name__}")
    return fun(p, q)


def _inf_where(cond, x):
    return _C.where(cond, _C.full_like(x, math.inf), x)


def _zero_where(cond, x):
    return _C.where(cond, _C.zeros_like(x), x)


@register_kl(Normal, Normal)
def _kl_normal_normal(p, q):
    var_ratio = (p.scale / q.scale).pow(2)
    t1 = ((p.loc - q.loc) / q.scale).pow(2)
    return 0.5 * (var_ratio + t1 - 1 - _C.log(var_ratio))


@register_kl(Bernoulli, Bernoulli)
def _kl_bernoulli_bernoulli(p, q):
    softplus = _C.softplus
    t1 = p.probs * (softplus(-q.logits) - softplus(-p.logits))
    t1 = _zero_where(p.probs == 0, _inf_where(q.probs == 0, t1))
    t2 = (1 - p.probs) * (softplus(q.logits) - softplus(p.logits))
    t2 = _zero_where(p.probs == 1, _inf_where(q.probs == 1, t2))
    return t1 + t2


@register_kl(Categorical, Categorical)
def _kl_categorical_categorical(p, q):
    t = p.probs * (p.logits - q.logits)
    shape = tuple(t.shape)
    t = _inf_where((q.probs == 0).expand(*shape), t)
    t = _zero_where((p.probs == 0).expand(*shape), t)
    return t.sum(-1)


@register_kl(OneHotCategorical, OneHotCategorical)
def _kl_onehotcategorical_onehotcategorical(p, q):
    return _kl_categorical_categorical(p._categorical, q._categorical)


@register_kl(Uniform, Uniform)
def _kl_uniform_uniform(p, q):
    result = _C.log((q.high - q.low) / (p.high - p.low))
    return _inf_where((q.low > p.low) | (q.high < p.high), result)


@register_kl(Exponential, Exponential)
def _kl_exponential_exponential(p, q):
    rate_ratio = q.rate / p.rate
    return -_C.log(rate_ratio) + rate_ratio - 1


@register_kl(Laplace, Laplace)
def _kl_laplace_laplace(p, q):
    scale_ratio = p.scale / q.scale
    loc_abs_diff = _C.abs(p.loc - q.loc)
    t1 = -_C.log(scale_ratio)
    t2 = loc_abs_diff / q.scale
    t3 = scale_ratio * _C.exp(-loc_abs_diff / p.scale)
    return t1 + t2 + t3 - 1


@register_kl(Independent, Independent)
def _kl_independent_independent(p, q):
    if p.reinterpreted_batch_ndims != q.reinterpreted_batch_ndims:
        raise NotImplementedError
    result = kl_divergence(p.base_dist, q.base_dist)
    return sum_rightmost(result, p.reinterpreted_batch_ndims)


# torch's pairs among the distributions above

@register_kl(Gumbel, Gumbel)
def _kl_gumbel_gumbel(p, q):
    ct1 = p.scale / q.scale
    ct2 = q.loc / q.scale
    ct3 = p.loc / q.scale
    t1 = -_C.log(ct1) - ct2 + ct3
    t2 = ct1 * EULER_GAMMA
    t3 = _C.exp(ct2 + _C.lgamma(1 + ct1) - ct3)
    return t1 + t2 + t3 - (1 + EULER_GAMMA)


@register_kl(Gamma, Gamma)
def _kl_gamma_gamma(p, q):
    t1 = q.concentration * _C.log(p.rate / q.rate)
    t2 = _C.lgamma(q.concentration) - _C.lgamma(p.concentration)
    t3 = (p.concentration - q.concentration) * _C.digamma(p.concentration)
    t4 = (q.rate - p.rate) * (p.concentration / p.rate)
    return t1 + t2 + t3 + t4


@register_kl(Beta, Beta)
def _kl_beta_beta(p, q):
    sum_p = p.concentration1 + p.concentration0
    sum_q = q.concentration1 + q.concentration0
    t1 = _C.lgamma(q.concentration1) + _C.lgamma(q.concentration0) + _C.lgamma(sum_p)
    t2 = _C.lgamma(p.concentration1) + _C.lgamma(p.concentration0) + _C.lgamma(sum_q)
    t3 = (p.concentration1 - q.concentration1) * _C.digamma(p.concentration1)
    t4 = (p.concentration0 - q.concentration0) * _C.digamma(p.concentration0)
    t5 = (sum_q - sum_p) * _C.digamma(sum_p)
    return t1 - t2 + t3 + t4 + t5


@register_kl(Dirichlet, Dirichlet)
def _kl_dirichlet_dirichlet(p, q):
    sum_p = p.concentration.sum(-1)
    sum_q = q.concentration.sum(-1)
    t1 = _C.lgamma(sum_p) - _C.lgamma(sum_q)
    t2 = (_C.lgamma(p.concentration) - _C.lgamma(q.concentration)).sum(-1)
    t3 = p.concentration - q.concentration
    t4 = _C.digamma(p.concentration) - _C.digamma(sum_p).unsqueeze(-1)
    return t1 - t2 + (t3 * t4).sum(-1)


@register_kl(MultivariateNormal, MultivariateNormal)
def _kl_multivariatenormal_multivariatenormal(p, q):
    if p.event_shape != q.event_shape:
        raise ValueError("KL-divergence between two Multivariate Normals with different event shapes cannot "
                         f"be computed: p's {p.event_shape}, q's {q.event_shape}")
    from .. import linalg
    Lp, Lq = p._unbroadcasted_scale_tril, q._unbroadcasted_scale_tril
    half_term1 = (_C.log(Lq.diagonal(dim1=-2, dim2=-1)).sum(-1) - _C.log(Lp.diagonal(dim1=-2, dim2=-1)).sum(-1))
    n = p.event_shape[0]
    batch = tuple(_C.broadcast_shapes(tuple(Lq.shape[:-2]), tuple(Lp.shape[:-2])))
    X = linalg.solve_triangular(Lq.expand(*(batch + (n, n))), Lp.expand(*(batch + (n, n))), upper=False)
    term2 = (X * X).reshape(batch + (-1,)).sum(-1)
    term3 = _batch_mahalanobis(Lq, q.loc - p.loc)
    return half_term1 + 0.5 * (term2 + term3 - n)


@register_kl(Binomial, Binomial)
def _kl_binomial_binomial(p, q):
    # torch's: a q with more trials than p is not written; fewer is infinite (p gives mass q cannot)
    if bool((p.total_count < q.total_count).any()):
        raise NotImplementedError("KL between Binomials where q.total_count > p.total_count is not implemented")
    kl = p.total_count * (p.probs * (p.logits - q.logits) + _C.log1p(-p.probs) - _C.log1p(-q.probs))
    return _C.where(p.total_count > q.total_count, _C.full_like(kl, math.inf), kl)


@register_kl(Exponential, Gamma)
def _kl_exponential_gamma(p, q):
    ratio = q.rate / p.rate
    t1 = -q.concentration * _C.log(ratio)
    return t1 + ratio + _C.lgamma(q.concentration) + q.concentration * EULER_GAMMA - (1 + EULER_GAMMA)


@register_kl(Gamma, Exponential)
def _kl_gamma_exponential(p, q):
    return -p.entropy() - _C.log(q.rate) + q.rate * (p.concentration / p.rate)


@register_kl(Poisson, Poisson)
def _kl_poisson_poisson(p, q):
    return p.rate * (_C.log(p.rate) - _C.log(q.rate)) - (p.rate - q.rate)


def _infinite_like(t):
    return _C.full_like(t, math.inf)


def _x_log_x(t):
    return t * _C.log(t)


@register_kl(ContinuousBernoulli, ContinuousBernoulli)
def _kl_continuous_bernoulli_continuous_bernoulli(p, q):
    t1 = p.mean * (p.logits - q.logits)
    t2 = p._cont_bern_log_norm() + _C.log1p(-p.probs)
    t3 = -q._cont_bern_log_norm() - _C.log1p(-q.probs)
    return t1 + t2 + t3


@register_kl(Geometric, Geometric)
def _kl_geometric_geometric(p, q):
    return -p.entropy() - _C.log1p(-q.probs) / p.probs - q.logits


@register_kl(HalfNormal, HalfNormal)
def _kl_halfnormal_halfnormal(p, q):
    return _kl_normal_normal(p.base_dist, q.base_dist)


@register_kl(LogNormal, LogNormal)
def _kl_lognormal_lognormal(p, q):
    # torch's LogNormal is a TransformedDistribution (exp of a Normal): its KL is the Normals'
    return _kl_normal_normal(p, q)


@register_kl(Pareto, Pareto)
def _kl_pareto_pareto(p, q):
    scale_ratio = p.scale / q.scale
    alpha_ratio = q.alpha / p.alpha
    t1 = q.alpha * _C.log(scale_ratio)
    t2 = -_C.log(alpha_ratio)
    result = t1 + t2 + alpha_ratio - 1
    return _inf_where(p.support.lower_bound < q.support.lower_bound, result)


def _transformed_parts(d):
    """(base distribution, transforms) of a TransformedDistribution, or of kiln's LogNormal as torch's
    (TransformedDistribution(Normal(loc, scale), [ExpTransform()]); kiln's is written directly)."""
    if isinstance(d, LogNormal):
        return Normal(d.loc, d.scale, validate_args=False), [ExpTransform()]
    return d.base_dist, d.transforms


@register_kl(TransformedDistribution, TransformedDistribution)
@register_kl(TransformedDistribution, LogNormal)
@register_kl(LogNormal, TransformedDistribution)
def _kl_transformed_transformed(p, q):
    (p_base, p_transforms), (q_base, q_transforms) = _transformed_parts(p), _transformed_parts(q)
    if p_transforms != q_transforms:
        raise NotImplementedError("kl_divergence of TransformedDistributions needs equal transforms")
    if p.event_shape != q.event_shape:
        raise NotImplementedError("kl_divergence of TransformedDistributions needs equal event_shape")
    return kl_divergence(p_base, q_base)


@register_kl(Cauchy, Cauchy)
def _kl_cauchy_cauchy(p, q):
    t1 = _C.log((p.scale + q.scale).pow(2) + (p.loc - q.loc).pow(2))
    t2 = _C.log(4 * p.scale * q.scale)
    return t1 - t2


@register_kl(ContinuousBernoulli, Pareto)
def _kl_continuous_bernoulli_infinity(p, q):
    return _infinite_like(p.probs)


@register_kl(ContinuousBernoulli, Exponential)
def _kl_continuous_bernoulli_exponential(p, q):
    return -p.entropy() - _C.log(q.rate) + q.rate * p.mean


@register_kl(ContinuousBernoulli, Normal)
def _kl_continuous_bernoulli_normal(p, q):
    t1 = -p.entropy()
    t2 = 0.5 * (math.log(2.0 * math.pi) + (q.loc / q.scale).pow(2)) + _C.log(q.scale)
    t3 = (p.variance + p.mean.pow(2) - 2.0 * q.loc * p.mean) / (2.0 * q.scale.pow(2))
    return t1 + t2 + t3


@register_kl(ContinuousBernoulli, Uniform)
def _kl_continuous_bernoulli_uniform(p, q):
    result = -p.entropy() + _C.log(q.high - q.low)
    return _inf_where((q.low >= p.support.lower_bound) | (q.high <= p.support.upper_bound), result)


@register_kl(Exponential, ContinuousBernoulli)
@register_kl(Exponential, Pareto)
@register_kl(Exponential, Uniform)
def _kl_exponential_infinity(p, q):
    return _infinite_like(p.rate)


@register_kl(Exponential, Gumbel)
def _kl_exponential_gumbel(p, q):
    scale_rate_prod = p.rate * q.scale
    loc_scale_ratio = q.loc / q.scale
    t1 = _C.log(scale_rate_prod) - 1
    t2 = _C.exp(loc_scale_ratio) * scale_rate_prod / (scale_rate_prod + 1)
    t3 = scale_rate_prod.reciprocal()
    return t1 - loc_scale_ratio + t2 + t3


@register_kl(Exponential, Normal)
def _kl_exponential_normal(p, q):
    var_normal = q.scale.pow(2)
    rate_sqr = p.rate.pow(2)
    t1 = 0.5 * _C.log(rate_sqr * var_normal * 2 * math.pi)
    t2 = rate_sqr.reciprocal()
    t3 = q.loc / p.rate
    t4 = q.loc.pow(2) * 0.5
    return t1 - 1 + (t2 - t3 + t4) / var_normal


@register_kl(Gumbel, ContinuousBernoulli)
@register_kl(Gumbel, Exponential)
@register_kl(Gumbel, Pareto)
@register_kl(Gumbel, Uniform)
def _kl_gumbel_infinity(p, q):
    return _infinite_like(p.loc)


@register_kl(Gumbel, Normal)
def _kl_gumbel_normal(p, q):
    param_ratio = p.scale / q.scale
    t1 = _C.log(param_ratio / math.sqrt(2 * math.pi))
    t2 = (math.pi * param_ratio * 0.5).pow(2) / 3
    t3 = ((p.loc + p.scale * EULER_GAMMA - q.loc) / q.scale).pow(2) * 0.5
    return -t1 + t2 + t3 - (EULER_GAMMA + 1)


@register_kl(Laplace, ContinuousBernoulli)
@register_kl(Laplace, Exponential)
@register_kl(Laplace, Pareto)
@register_kl(Laplace, Uniform)
def _kl_laplace_infinity(p, q):
    return _infinite_like(p.loc)


@register_kl(Laplace, Normal)
def _kl_laplace_normal(p, q):
    var_normal = q.scale.pow(2)
    scale_sqr_var_ratio = p.scale.pow(2) / var_normal
    t1 = 0.5 * _C.log(2 * scale_sqr_var_ratio / math.pi)
    t2 = 0.5 * p.loc.pow(2)
    t3 = p.loc * q.loc
    t4 = 0.5 * q.loc.pow(2)
    return -t1 + scale_sqr_var_ratio + (t2 - t3 + t4) / var_normal - 1


@register_kl(Normal, ContinuousBernoulli)
@register_kl(Normal, Exponential)
@register_kl(Normal, Pareto)
@register_kl(Normal, Uniform)
def _kl_normal_infinity(p, q):
    return _infinite_like(p.loc)


@register_kl(Normal, Gumbel)
def _kl_normal_gumbel(p, q):
    mean_scale_ratio = p.loc / q.scale
    var_scale_sqr_ratio = (p.scale / q.scale).pow(2)
    loc_scale_ratio = q.loc / q.scale
    t1 = _C.log(var_scale_sqr_ratio) * 0.5
    t2 = mean_scale_ratio - loc_scale_ratio
    t3 = _C.exp(-mean_scale_ratio + 0.5 * var_scale_sqr_ratio + loc_scale_ratio)
    return -t1 + t2 + t3 - (0.5 * (1 + math.log(2 * math.pi)))


@register_kl(Normal, Laplace)
def _kl_normal_laplace(p, q):
    loc_diff = p.loc - q.loc
    scale_ratio = p.scale / q.scale
    loc_diff_scale_ratio = loc_diff / p.scale
    t1 = _C.log(scale_ratio)
    t2 = math.sqrt(2 / math.pi) * p.scale * _C.exp(-0.5 * loc_diff_scale_ratio.pow(2))
    t3 = loc_diff * _C.erf(math.sqrt(0.5) * loc_diff_scale_ratio)
    return -t1 + (t2 + t3) / q.scale - (0.5 * (1 + math.log(0.5 * math.pi)))


@register_kl(Pareto, ContinuousBernoulli)
@register_kl(Pareto, Uniform)
def _kl_pareto_infinity(p, q):
    return _infinite_like(p.scale)


@register_kl(Pareto, Exponential)
def _kl_pareto_exponential(p, q):
    scale_rate_prod = p.scale * q.rate
    t1 = _C.log(p.alpha / scale_rate_prod)
    t2 = p.alpha.reciprocal()
    t3 = p.alpha * scale_rate_prod / (p.alpha - 1)
    return _inf_where(p.alpha <= 1, t1 - t2 + t3 - 1)


@register_kl(Pareto, Normal)
def _kl_pareto_normal(p, q):
    var_normal = 2 * q.scale.pow(2)
    common_term = p.scale / (p.alpha - 1)
    t1 = _C.log(math.sqrt(2 * math.pi) * q.scale * p.alpha / p.scale)
    t2 = p.alpha.reciprocal()
    t3 = p.alpha * common_term.pow(2) / (p.alpha - 2)
    t4 = (p.alpha * common_term - q.loc).pow(2)
    return _inf_where(p.alpha <= 2, t1 - t2 + (t3 + t4) / var_normal - 1)


@register_kl(Uniform, ContinuousBernoulli)
def _kl_uniform_continuous_bernoulli(p, q):
    result = -p.entropy() - p.mean * q.logits - _C.log1p(-q.probs) - q._cont_bern_log_norm()
    return _inf_where((p.high >= q.support.upper_bound) | (p.low <= q.support.lower_bound), result)


@register_kl(Uniform, Exponential)
def _kl_uniform_exponential(p, q):
    result = q.rate * (p.high + p.low) / 2 - _C.log((p.high - p.low) * q.rate)
    return _inf_where(p.low < q.support.lower_bound, result)


@register_kl(Uniform, Gumbel)
def _kl_uniform_gumbel(p, q):
    common_term = q.scale / (p.high - p.low)
    high_loc_diff = (p.high - q.loc) / q.scale
    low_loc_diff = (p.low - q.loc) / q.scale
    t1 = _C.log(common_term) + 0.5 * (high_loc_diff + low_loc_diff)
    t2 = common_term * (_C.exp(-high_loc_diff) - _C.exp(-low_loc_diff))
    return t1 - t2


@register_kl(Uniform, Normal)
def _kl_uniform_normal(p, q):
    common_term = p.high - p.low
    t1 = _C.log(math.sqrt(math.pi * 2) * q.scale / common_term)
    t2 = common_term.pow(2) / 12
    t3 = ((p.high + p.low - 2 * q.loc) / 2).pow(2)
    return t1 + 0.5 * (t2 + t3) / q.scale.pow(2)


@register_kl(Uniform, Pareto)
def _kl_uniform_pareto(p, q):
    support_uniform = p.high - p.low
    t1 = _C.log(q.alpha * q.scale.pow(q.alpha) * support_uniform)
    t2 = (_x_log_x(p.high) - _x_log_x(p.low) - support_uniform) / support_uniform
    return _inf_where(p.low < q.support.lower_bound, t2 * (q.alpha + 1) - t1)
