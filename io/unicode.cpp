// Lookups in the generated tables of io/unicode_tables.inc (sorted by code point, searched by
// bisection) and the algorithmic parts: the Final_Sigma context, the Hangul decomposition and the
// canonical ordering of NFD.
#include "io/unicode.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

namespace kiln::io::unicode {
namespace {

struct Range {
  char32_t lo, hi;
};
// str.lower() maps c in [lo, hi] with (c - lo) % step == 0 to c + delta (the rest of the run: none).
struct LowerRun {
  char32_t lo, hi;
  int32_t step, delta;
};
struct LowerMulti {
  char32_t c;
  char32_t to[3];  // zero-padded
};
struct CombiningClass {
  char32_t lo, hi;
  int32_t ccc;
};
struct Decomposition {
  char32_t c;
  char32_t to[4];  // zero-padded
};

#include "io/unicode_tables.inc"

template <size_t N> bool in_ranges(const Range (&table)[N], char32_t c) {
  if (c < table[0].lo) return false;  // most tables start past ASCII: no search for it
  const auto it =
      std::upper_bound(std::begin(table), std::end(table), c, [](char32_t v, const Range& r) { return v < r.lo; });
  return it != std::begin(table) && c <= std::prev(it)->hi;
}

// The entry of a table sorted by `lo` (or `c`) whose range holds c, or nullptr.
template <typename T, size_t N> const T* find_run(const T (&table)[N], char32_t c) {
  const auto it =
      std::upper_bound(std::begin(table), std::end(table), c, [](char32_t v, const T& r) { return v < r.lo; });
  return it != std::begin(table) && c <= std::prev(it)->hi ? &*std::prev(it) : nullptr;
}

template <typename T, size_t N> const T* find_one(const T (&table)[N], char32_t c) {
  const auto it =
      std::lower_bound(std::begin(table), std::end(table), c, [](const T& r, char32_t v) { return r.c < v; });
  return it != std::end(table) && it->c == c ? &*it : nullptr;
}

int ccc(char32_t c) {
  if (c < kCombiningClass[0].lo) return 0;
  const CombiningClass* r = find_run(kCombiningClass, c);
  return r ? r->ccc : 0;
}

bool is_case_ignorable(char32_t c) { return in_ranges(kCaseIgnorable, c); }
bool is_cased(char32_t c) { return in_ranges(kCased, c); }

// Hangul syllables: S = SBase + (L * VCount + V) * TCount + T (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kVCount = 21, kTCount = 28, kSCount = 19 * kVCount * kTCount;

}  // namespace

const char* const kUnicodeVersion = kUnicodeVersionTable;

bool is_control(char32_t c) { return in_ranges(kControl, c); }
bool is_whitespace(char32_t c) { return in_ranges(kWhitespace, c); }
bool is_punctuation(char32_t c) { return in_ranges(kPunctuation, c); }
bool is_nonspacing_mark(char32_t c) { return in_ranges(kNonspacingMark, c); }

bool is_chinese_char(char32_t c) {
  auto in = [c](char32_t lo, char32_t hi) { return c >= lo && c <= hi; };
  return in(0x4E00, 0x9FFF) || in(0x3400, 0x4DBF) || in(0x20000, 0x2A6DF) || in(0x2A700, 0x2B73F) ||
         in(0x2B740, 0x2B81F) || in(0x2B820, 0x2CEAF) || in(0xF900, 0xFAFF) || in(0x2F800, 0x2FA1F);
}

std::u32string to_lower(std::u32string_view s) {
  std::u32string out;
  to_lower(s, &out);
  return out;
}

void to_lower(std::u32string_view s, std::u32string* out_) {
  std::u32string& out = *out_;
  out.clear();
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char32_t c = s[i];
    if (c < 0x80) {
      out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    } else if (c == 0x3A3) {
      // Final_Sigma: a cased letter before (case-ignorable ones skipped), none after.
      size_t j = i;
      while (j > 0 && is_case_ignorable(s[j - 1])) --j;
      bool final = j > 0 && is_cased(s[j - 1]);
      size_t k = i + 1;
      while (k < s.size() && is_case_ignorable(s[k])) ++k;
      final = final && !(k < s.size() && is_cased(s[k]));
      out.push_back(final ? 0x3C2 : 0x3C3);
    } else if (const LowerMulti* m = find_one(kLowerMulti, c)) {
      for (char32_t t : m->to)
        if (t) out.push_back(t);
    } else {
      const LowerRun* r = find_run(kLower, c);
      out.push_back(r && (c - r->lo) % char32_t(r->step) == 0 ? char32_t(int64_t(c) + r->delta) : c);
    }
  }
}

std::u32string nfd(std::u32string_view s) {
  std::u32string out;
  nfd(s, &out);
  return out;
}

void nfd(std::u32string_view s, std::u32string* out_) {
  std::u32string& out = *out_;
  out.clear();
  out.reserve(s.size());
  static_assert(kDecomposition[0].c <= kCombiningClass[0].lo, "the fast path below assumes it");
  bool marks = false;  // a character of nonzero combining class seen: only then is there order to fix
  auto put = [&](char32_t t) {
    out.push_back(t);
    marks = marks || ccc(t) != 0;
  };
  for (const char32_t c : s) {
    if (c < kDecomposition[0].c) {
      out.push_back(c);  // nothing below decomposes or combines
    } else if (c >= kSBase && c < kSBase + kSCount) {
      const char32_t i = c - kSBase;
      out.push_back(kLBase + i / (kVCount * kTCount));
      out.push_back(kVBase + i % (kVCount * kTCount) / kTCount);
      if (i % kTCount) out.push_back(kTBase + i % kTCount);
    } else if (const Decomposition* d = find_one(kDecomposition, c)) {
      for (char32_t t : d->to)
        if (t) put(t);
    } else {
      put(c);
    }
  }
  if (!marks) return;
  // Canonical ordering: each run of marks (ccc > 0) sorted by class, stably.
  for (size_t i = 0; i < out.size();) {
    if (ccc(out[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < out.size() && ccc(out[j]) != 0) ++j;
    std::stable_sort(out.begin() + std::ptrdiff_t(i), out.begin() + std::ptrdiff_t(j),
                     [](char32_t a, char32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }
}

}  // namespace kiln::io::unicode
