// Kiln's public API in one include: tensors, ops, nn ops and modules, optimizers, autograd, random numbers, the thread pool,
// the Context of settings.
#pragma once
#include "base/dtype.h"
#include "base/error.h"
#include "base/thread_pool.h"
#include "engine/amp.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/context.h"
#include "engine/gradcheck.h"
#include "engine/init.h"
#include "engine/nn.h"
#include "engine/nn_ops.h"
#include "engine/ops.h"
#include "engine/optim.h"
#include "engine/random.h"
#include "engine/tensor.h"
