// The consumer's own base/macros.h, as a research repo might have: Kiln's installed headers include
// theirs as "kiln/base/macros.h", so this one must not replace it (it defines no KILN_HD).
#pragma once
#define CONSUMER_MACROS 1
