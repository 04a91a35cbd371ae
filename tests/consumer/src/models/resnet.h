// The consumer's own models/resnet.h, beside Kiln's <kiln/models/resnet.h> in the same program.
#pragma once
namespace consumer {
constexpr int resnet_depth = 20;
}  // namespace consumer
