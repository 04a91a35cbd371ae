// Kiln's public API in one include: tensors, ops, nn ops and modules, optimizers, autograd, random numbers, the thread pool.
#pragma once
#include "engine/autograd.h"
#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/gradcheck.h"
#include "engine/init.h"
#include "engine/nn.h"
#include "engine/nn_ops.h"
#include "engine/ops.h"
#include "engine/optim.h"
#include "engine/random.h"
#include "engine/tensor.h"
#include "engine/thread_pool.h"
