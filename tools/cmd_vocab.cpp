// `kiln vocab`: learn a WordPiece vocabulary from a corpus, so a user with no vocab.txt can start.

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>

#include "io/idx.h"
#include "io/text.h"
#include "tools/cli_checks.h"
#include "tools/train.h"

namespace kiln::tools {

namespace fs = std::filesystem;

void add_vocab_flags(CLI::App& app, VocabOptions& o) {
  app.add_option("--text", o.text,
                 "Text files or directories of them, sub-directories included (links to files followed; hidden and "
                 "binary files and a directory's --out file skipped): the files `kiln train --text` reads")
      ->required();
  app.add_option("--size", o.size,
                 "Vocabulary size, special tokens included; one too small for every character seen keeps the most "
                 "frequent ones (the rest become [UNK]) and says how many it dropped")
      ->check(between(int64_t(16), int64_t(1) << 22))
      ->capture_default_str();
  app.add_option("--min-frequency", o.min_frequency, "Stop merging when the best pair occurs fewer times")
      ->check(at_least(1))
      ->capture_default_str();
  add_on_off_flag(
      app, "--lower-case,!--no-lower-case", o.lower_case,
      std::string("Lower-case and strip accents before WordPiece (as BERT's uncased models): ") + io::kLowerCaseScope);
  app.add_option("--out", o.out, "Where to write vocab.txt")->required();
  app.add_flag("--overwrite", o.overwrite, "Replace --out when it exists");
}

namespace {

// The checks of --out before any reading: "" when the file can be written there.
std::string check_out(const VocabOptions& o) {
  return output_file_problem("--out", o.out, "file to write (" + (fs::path(o.out) / "vocab.txt").string() + ", say)");
}

// How many of the characters seen (as word starts and "##" continuations, as the builder counts them)
// `v` lacks.
int64_t characters_dropped(const std::vector<std::string>& files, const io::BasicTokenizerOptions& t,
                           const io::Vocab& v) {
  std::set<std::string> missing;
  for (const auto& f : files)
    for (const auto& w : io::basic_tokenize(io::read_maybe_gzip(f), t)) {
      const std::u32string cps = io::decode_utf8(w);
      if (cps.size() > 100) continue;  // the builder skips such words too
      for (size_t i = 0; i < cps.size(); ++i) {
        const std::string piece = (i ? "##" : "") + io::encode_utf8(cps.substr(i, 1));
        if (v.id(piece) < 0) missing.insert(piece);
      }
    }
  return int64_t(missing.size());
}

// Whether `v` holds only the special tokens and single characters: the builder fills the alphabet
// first, so a full vocabulary without a merge may have had no room for all of it.
bool only_characters(const io::Vocab& v) {
  for (int64_t i = int64_t(io::kBertSpecialTokens.size()); i < v.size(); ++i) {
    std::string t = v.token(i);
    if (t.rfind("##", 0) == 0) t = t.substr(2);
    if (io::decode_utf8(t).size() > 1) return false;
  }
  return true;
}

}  // namespace

int run_vocab(const VocabOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> files;
  try {
    if (const std::string bad = check_out(o); !bad.empty()) KILN_FAIL(bad);
    files = expand_text_paths(o.text, "--text");
    if (const std::string clash = output_is_input("--out", o.out, o.text); !clash.empty()) KILN_FAIL(clash);
    std::error_code ec;
    KILN_CHECK(o.overwrite || !fs::exists(o.out, ec), "--out ", o.out,
               " already exists: add --overwrite to replace it, or write to another path");
    // A directory walked for --text may hold --out itself (the vocabulary of an earlier run): not text
    // to learn from.
    const auto is_out = [&](const std::string& f) { return fs::exists(o.out, ec) && fs::equivalent(f, o.out, ec); };
    if (const auto it = std::find_if(files.begin(), files.end(), is_out); it != files.end()) {
      std::fprintf(stderr, "kiln vocab: note: skipping %s in the --text directory: it is the --out file\n",
                   it->c_str());
      std::erase_if(files, is_out);
      KILN_CHECK(!files.empty(), "--text: no text files besides the --out file ", o.out);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "kiln vocab: error: %s\n", e.message().c_str());
    return 2;
  }
  const io::BasicTokenizerOptions t{o.lower_case, o.lower_case};
  io::Vocab v;
  try {
    v = io::build_wordpiece_vocab(files, o.size, t, o.min_frequency);
  } catch (const Error& e) {
    // What the builder refuses is the text it was given (no words in it, a file it cannot read).
    std::string m = e.message();
    if (m.rfind("build_wordpiece_vocab: ", 0) == 0) m = m.substr(23);
    std::fprintf(stderr, "kiln vocab: error: --text: %s\n", m.c_str());
    return 2;
  }
  if (v.size() == o.size && only_characters(v))
    if (const int64_t dropped = characters_dropped(files, t, v); dropped > 0)
      std::fprintf(stderr,
                   "kiln vocab: warning: --size %lld holds only the %lld most frequent characters: %lld rarer ones "
                   "(word starts and ## continuations counted apart) will read as [UNK]; a larger --size keeps them\n",
                   (long long)o.size, (long long)(o.size - int64_t(io::kBertSpecialTokens.size())), (long long)dropped);
  v.save(o.out);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote %s: %lld tokens from %zu file%s in %.1f s%s\n", o.out.c_str(), (long long)v.size(), files.size(),
              files.size() == 1 ? "" : "s", s,
              v.size() < o.size ? " (fewer than asked: no pair left occurs --min-frequency times)" : "");
  return 0;
}

}  // namespace kiln::tools
