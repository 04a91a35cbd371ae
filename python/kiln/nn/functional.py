"""kiln.nn.functional: convolution, pooling, normalisation, activations, softmax, losses,
embedding, dropout, attention, padding and resampling, with torch.nn.functional's argument names."""
from .._C import (  # noqa: F401
    linear, conv1d, conv2d, conv3d, conv_transpose1d, conv_transpose2d,
    max_pool1d, max_pool2d, max_pool3d, avg_pool1d, avg_pool2d, avg_pool3d, max_unpool1d, max_unpool2d,
    max_unpool3d,
    adaptive_avg_pool2d, batch_norm, batch_norm_relu, layer_norm, group_norm, instance_norm, rms_norm, local_response_norm,
    relu, gelu, sigmoid, tanh, silu, mish, softsign, logsigmoid, selu, relu6, hardsigmoid, hardswish, softplus,
    leaky_relu, elu, celu, hardtanh, prelu, glu, softmax, log_softmax,
    cross_entropy, nll_loss, mse_loss, l1_loss, binary_cross_entropy_with_logits, binary_cross_entropy,
    smooth_l1_loss, huber_loss, kl_div, margin_ranking_loss, cosine_embedding_loss, cosine_similarity, ctc_loss,
    embedding, dropout, scaled_dot_product_attention, pad, interpolate, pixel_shuffle, pixel_unshuffle,
    one_hot, masked_softmax, attention,
)

swish = silu


def upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
             recompute_scale_factor=None):
    """torch.nn.functional.upsample: interpolate under its older name."""
    return interpolate(input, size=size, scale_factor=scale_factor, mode=mode, align_corners=align_corners,
                       recompute_scale_factor=recompute_scale_factor)
