// `kiln vocab`: learn a WordPiece vocabulary from a corpus, so a user with no vocab.txt can start.
#include <chrono>
#include <cstdio>

#include "io/text.h"
#include "tools/cli_checks.h"
#include "tools/train.h"

namespace kiln::tools {

void add_vocab_flags(CLI::App& app, VocabOptions& o) {
  app.add_option("--text", o.text, "Text files or directories of them")->required();
  app.add_option("--size", o.size, "Vocabulary size, special tokens included")
      ->check(between(int64_t(16), int64_t(1) << 22))
      ->capture_default_str();
  app.add_option("--min-frequency", o.min_frequency, "Stop merging when the best pair occurs fewer times")
      ->check(at_least(1))
      ->capture_default_str();
  add_on_off_flag(app, "--lower-case,!--no-lower-case", o.lower_case, "Lower-case and strip accents first");
  app.add_option("--out", o.out, "Where to write vocab.txt")->required();
}

int run_vocab(const VocabOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> files;
  try {
    files = expand_text_paths(o.text, "--text");
    if (const std::string clash = output_is_input("--out", o.out, files); !clash.empty()) KILN_FAIL(clash);
  } catch (const Error& e) {
    std::fprintf(stderr, "kiln vocab: error: %s\n", e.message().c_str());
    return 2;
  }
  const io::Vocab v = io::build_wordpiece_vocab(files, o.size, {o.lower_case, o.lower_case}, o.min_frequency);
  v.save(o.out);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote %s: %lld tokens from %zu file(s) in %.1f s%s\n", o.out.c_str(), (long long)v.size(), files.size(), s,
              v.size() < o.size ? " (fewer than asked: no pair left occurs --min-frequency times)" : "");
  return 0;
}

}  // namespace kiln::tools
