// A research repo's headers with Kiln's generic names (src/base/macros.h, src/models/resnet.h) on
// the consumer's own -I path, next to Kiln's installed headers: each include gets its own file.
#include <kiln/kiln.h>
#include <kiln/models/resnet.h>

#include <cstdio>
#include <string>

#include "base/macros.h"
#include "models/resnet.h"

static_assert(CONSUMER_MACROS == 1, "the consumer's base/macros.h was not the one included");

int clashing_headers() {
  kiln::models::ResNetConfig cfg;
  cfg.name = "resnet" + std::to_string(consumer::resnet_depth);
  if (!kiln::models::is_resnet_name(cfg.name)) {
    std::printf("clash: %s is not a Kiln ResNet name\n", cfg.name.c_str());
    return 1;
  }
  return 0;
}
