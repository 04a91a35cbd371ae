// Text for BERT: the basic tokenizer (punctuation, accents, CJK, controls, bad UTF-8), WordPiece,
// vocabularies (files, errors, the builder), masked-LM masking statistics and TSV classification.
#include <doctest/doctest.h>

#include <fstream>
#include <map>

#include "io/text.h"
#include "kiln.h"
#include "test_util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::error_of;
using kiln::testing::TempDir;
using Words = std::vector<std::string>;

namespace {
std::shared_ptr<io::WordPieceTokenizer> toy_tokenizer() {
  Words t = io::kBertSpecialTokens;
  for (const char* w : {"un", "##aff", "##able", "aff", "able", "runs", "run", "##s", "the", "a", "b", "c", ",", "!", "hello", "world"})
    t.push_back(w);
  return std::make_shared<io::WordPieceTokenizer>(io::Vocab::from_tokens(t, "toy vocab"));
}
}  // namespace

TEST_CASE("basic tokenizer: whitespace, punctuation, case, accents, CJK, controls, malformed UTF-8") {
  CHECK(io::basic_tokenize("Hello, World!") == Words{"hello", ",", "world", "!"});
  CHECK(io::basic_tokenize("  tabs\tand\nnewlines\r\n ") == Words{"tabs", "and", "newlines"});
  CHECK(io::basic_tokenize("H\xc3\xa9llo \xc3\x91" "and\xc3\xba Stra\xc3\x9f" "e") == Words{"hello", "nandu", "straße"});
  CHECK(io::basic_tokenize("e\xcc\x81t\xc3\xa9") == Words{"ete"});  // a combining acute accent, and a precomposed one
  CHECK(io::basic_tokenize("\xc5\x81\xc3\xb3" "d\xc5\xba") == Words{"łodz"});  // Ł has no decomposition; ź does
  CHECK(io::basic_tokenize("ab\xe4\xb8\xad\xe6\x96\x87" "cd") == Words{"ab", "中", "文", "cd"});
  CHECK(io::basic_tokenize("a\x01" "b\x7f" "c") == Words{"abc"});
  CHECK(io::basic_tokenize("a\xff" "b") == Words{"ab"});  // U+FFFD is dropped like a control
  CHECK(io::basic_tokenize("no\xc2\xa0" "break\xe3\x80\x80" "space") == Words{"no", "break", "space"});
  CHECK(io::basic_tokenize("\xc2\xabquoted\xc2\xbb\xe2\x80\x94" "dash") == Words{"«", "quoted", "»", "—", "dash"});
  CHECK(io::basic_tokenize("don't e-mail $5") == Words{"don", "'", "t", "e", "-", "mail", "$", "5"});
  CHECK(io::basic_tokenize("\xce\x91\xce\x92\xce\x93 \xd0\x94\xd0\x96") == Words{"αβγ", "дж"});
  CHECK(io::basic_tokenize("Caf\xc3\xa9", {false, false}) == Words{"Café"});
  CHECK(io::basic_tokenize("").empty());
  CHECK(io::decode_utf8("\xe2\x82") == std::u32string{0xFFFD, 0xFFFD});  // truncated sequence
  CHECK(io::decode_utf8("\xc0\xaf") == std::u32string{0xFFFD, 0xFFFD});  // overlong '/'
  CHECK(io::encode_utf8(io::decode_utf8("x\xf0\x9f\x98\x80y")) == "x\xf0\x9f\x98\x80y");
}

TEST_CASE("wordpiece: greedy longest match, [UNK] for what cannot be split, decode glues pieces") {
  auto tok = toy_tokenizer();
  CHECK(tok->tokenize("unaffable") == Words{"un", "##aff", "##able"});
  CHECK(tok->tokenize("Runs, hello!") == Words{"runs", ",", "hello", "!"});
  CHECK(tok->tokenize("unxyz the") == Words{"[UNK]", "the"});
  CHECK(tok->tokenize(std::string(101, 'a')) == Words{"[UNK]"});  // longer than 100 characters
  const auto ids = tok->encode("the unaffable world");
  CHECK(ids.size() == 5);
  CHECK(tok->decode(ids) == "the unaffable world");
  CHECK(tok->cls_id == 2);
  CHECK(tok->mask_id == 4);
}

TEST_CASE("vocab: file round trip, duplicates, missing special tokens") {
  TempDir d("kiln_vocab");
  const auto tok = toy_tokenizer();
  tok->vocab().save(d / "vocab.txt");
  const io::Vocab back = io::Vocab::load(d / "vocab.txt");
  REQUIRE(back.size() == tok->vocab().size());
  for (int64_t i = 0; i < back.size(); ++i) CHECK(back.token(i) == tok->vocab().token(i));
  std::ofstream(d / "crlf.txt") << "[UNK]\r\nhello\r\n";
  CHECK(io::Vocab::load(d / "crlf.txt").id("hello") == 1);
  std::ofstream(d / "dup.txt") << "[UNK]\na\nb\na\n";
  CHECK(contains(error_of([&] { io::Vocab::load(d / "dup.txt"); }), "'a' appears twice (lines 2 and 4)"));
  std::ofstream(d / "nounk.txt") << "a\nb\n";
  CHECK(contains(error_of([&] { io::WordPieceTokenizer(io::Vocab::load(d / "nounk.txt")); }), "no [UNK] token"));
  CHECK(contains(error_of([&] { io::Vocab::load(d / "absent.txt"); }), "absent.txt: cannot open"));
  std::ofstream(d / "corpus.txt") << "some words here\n";
  std::ofstream(d / "nomask.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\nsome\nwords\n";
  auto nomask = std::make_shared<io::WordPieceTokenizer>(io::Vocab::load(d / "nomask.txt"));
  CHECK(contains(error_of([&] { io::MlmDataset(nomask, {d / "corpus.txt"}, {}); }), "nomask.txt: the vocabulary has no [MASK]"));
}

TEST_CASE("vocab builder: specials first, every character, frequent words whole, deterministic") {
  TempDir d("kiln_vocab");
  {
    std::ofstream f(d / "corpus.txt");
    for (int i = 0; i < 200; ++i) f << "the quick brown fox jumps over the lazy dog. The dog sleeps!\n";
    f << "zebra x\n";
  }
  const io::Vocab v = io::build_wordpiece_vocab({d / "corpus.txt"}, 60);
  const io::Vocab w = io::build_wordpiece_vocab({d / "corpus.txt"}, 60);
  CHECK(v.size() == 60);
  for (int64_t i = 0; i < v.size(); ++i) CHECK(v.token(i) == w.token(i));
  for (size_t i = 0; i < io::kBertSpecialTokens.size(); ++i) CHECK(v.token(int64_t(i)) == io::kBertSpecialTokens[i]);
  for (const char* s : {"the", "dog", "z", "##e", "!", "."}) CHECK_MESSAGE(v.id(s) >= 0, s);
  io::WordPieceTokenizer tok(v);
  CHECK(tok.tokenize("The dog") == Words{"the", "dog"});
  for (const auto& t : tok.tokenize("the quick brown fox jumps over the lazy dog zebra x")) CHECK(t != "[UNK]");
  // A size the corpus cannot fill stops at the last pair that occurs twice.
  CHECK(io::build_wordpiece_vocab({d / "corpus.txt"}, 100000).size() < 200);
  CHECK(contains(error_of([&] { io::build_wordpiece_vocab({d / "corpus.txt"}, 3); }), "no room"));
}

TEST_CASE("masked LM: packing, 15% masked as 80/10/10, reproducible per (seed, sample)") {
  TempDir d("kiln_mlm");
  auto tok = toy_tokenizer();
  {
    std::ofstream f(d / "corpus.txt");
    for (int i = 0; i < 3000; ++i) f << "the a b c runs hello world , the a b c !\n" << (i % 7 == 6 ? "%\n" : "");
  }
  io::MlmDataset ds(tok, {d / "corpus.txt"}, {32, 0.15});
  REQUIRE(ds.size() > 100);
  std::vector<int64_t> all(size_t(ds.size()));
  for (int64_t i = 0; i < ds.size(); ++i) all[size_t(i)] = i;
  const io::Batch b = ds.get_batch(all, 42);
  const Tensor& ids = b.at("input_ids");
  CHECK(ids.shape() == Shape{ds.size(), 32});
  int64_t real = 0, masked = 0, as_mask = 0, kept = 0;
  const int64_t* x = ids.data<int64_t>();
  const int64_t* l = b.at("labels").data<int64_t>();
  const int64_t* m = b.at("attention_mask").data<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    if (!m[i]) {
      CHECK(x[i] == tok->pad_id);
      CHECK(l[i] == -100);
      continue;
    }
    if (i % 32 == 0) CHECK(x[i] == tok->cls_id);
    if (x[i] == tok->cls_id || x[i] == tok->sep_id) continue;
    ++real;
    if (l[i] == -100) continue;
    ++masked;
    as_mask += x[i] == tok->mask_id;
    kept += x[i] == l[i];
  }
  const double rate = double(masked) / double(real);
  CHECK(rate == doctest::Approx(0.15).epsilon(0.1));  // within 10% of 15%
  CHECK(double(as_mask) / double(masked) == doctest::Approx(0.8).epsilon(0.05));
  // Kept: the 10% left alone plus random draws that hit the original token (1 in 21 here).
  CHECK(double(kept) / double(masked) == doctest::Approx(0.1 + 0.1 / 21).epsilon(0.2));
  // Every sequence has a target; the same (seed, sample) masks the same way in any batch.
  for (int64_t i = 0; i < ds.size(); ++i) {
    bool any = false;
    for (int64_t j = 0; j < 32; ++j) any = any || l[i * 32 + j] != -100;
    CHECK(any);
  }
  const io::Batch one = ds.get_batch({7}, 42);
  CHECK(std::equal(x + 7 * 32, x + 8 * 32, one.at("input_ids").data<int64_t>()));
  CHECK(ds.get_batch({7}, 43).at("labels").to_vector() != one.at("labels").to_vector());
  CHECK(contains(error_of([&] { io::MlmDataset(tok, {d / "corpus.txt"}, {4, 0.15}); }), "at least 8"));
}

TEST_CASE("tsv classification: header, label ids, cut to length, errors name file and row") {
  TempDir d("kiln_tsv");
  auto tok = toy_tokenizer();
  std::ofstream(d / "train.tsv") << "label\ttext\npos\thello world\nneg\tthe a b c runs the a b c runs\npos\trun\n";
  io::TsvClassificationDataset train(tok, d / "train.tsv", 8);
  CHECK(train.size() == 3);
  CHECK(train.label_names() == Words{"neg", "pos"});
  const io::Batch b = train.get_batch({0, 1}, 0);
  CHECK(b.at("target").to_vector() == std::vector<double>{1, 0});
  const auto row = b.at("input_ids").to_vector();
  CHECK(row[0] == tok->cls_id);
  CHECK(row[3] == tok->sep_id);
  CHECK(row[8 + 7] == tok->sep_id);  // cut to 8 with [SEP] kept
  CHECK(b.at("attention_mask").to_vector()[4] == 0);
  std::ofstream(d / "eval.tsv") << "pos\thello\nmaybe\tworld\n";
  CHECK(contains(error_of([&] { io::TsvClassificationDataset(tok, d / "eval.tsv", 8, train.label_names()); }),
                 "row 2 has label 'maybe'"));
  std::ofstream(d / "bad.tsv") << "pos\thello\nno tab here\n";
  CHECK(contains(error_of([&] { io::TsvClassificationDataset(tok, d / "bad.tsv", 8); }), "bad.tsv:2: expected label<TAB>text"));
}

TEST_CASE("vocab and masked LM: bytes that are not UTF-8 are counted and named once per file, not fatal") {
  TempDir d("kiln_vocab");
  {
    std::ofstream f(d / "latin1.txt", std::ios::binary);
    for (int i = 0; i < 50; ++i) f << "the quick brown fox jumps over the lazy dog\n";
    f << "caf\xe9 na\xefve\n";  // Latin-1: two bytes that are not UTF-8
  }
  auto r =
      kiln::testing::run_kiln("vocab --text " + d / "latin1.txt" + " --size 60 --out " + d / "v.txt", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  const std::string says = d / "latin1.txt" + ": 2 bytes are not valid UTF-8";
  CHECK_MESSAGE(contains(r.output, says), r.output);
  CHECK(r.output.find(says) == r.output.rfind(says));  // once for the file
  r = kiln::testing::run_kiln("vocab --text " + d / "v.txt" + " --size 60 --out " + d / "v2.txt", d.p.string());
  CHECK_MESSAGE(!contains(r.output, "UTF-8"), r.output);  // a clean file: nothing said
}
