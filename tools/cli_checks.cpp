#include "tools/cli_checks.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <unistd.h>

namespace kiln::tools {

std::string command_path(const CLI::App& app) {
  std::string path = app.get_name();
  for (const CLI::App* p = app.get_parent(); p != nullptr; p = p->get_parent())
    path = (p->get_parent() != nullptr ? p->get_name() : std::string("kiln")) + " " + path;
  return app.get_parent() != nullptr ? path : "kiln";
}

const CLI::App& deepest_parsed(const CLI::App& top) {
  const CLI::App* app = &top;
  while (!app->get_subcommands().empty()) app = app->get_subcommands().back();
  return *app;
}

void take_last_value(CLI::App& app) {
  for (CLI::Option* o : app.get_options())
    if (o->get_expected_max() <= 1) o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  for (CLI::App* sub : app.get_subcommands({})) take_last_value(*sub);
}

namespace {

// Words CLI11 left with `app` that are a mistake: none for a command that takes extras (kiln launch
// names its own), nor a lone `--` (`kiln --bogus launch -- echo hi` leaves one with launch; the mistake
// is the top level's --bogus).
bool has_leftovers(const CLI::App& app) {
  if (app.get_allow_extras()) return false;
  const std::vector<std::string> extra = app.remaining();
  return std::any_of(extra.begin(), extra.end(), [](const std::string& w) { return w != "--"; });
}

// The deepest command given that has words left over (CLI11 keeps them with the command that could
// not place them, in command-line order).
const CLI::App* with_leftovers(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands())
    if (const CLI::App* found = with_leftovers(*sub)) return found;
  return has_leftovers(app) ? &app : nullptr;
}

// Whether `app` takes words other than flags (a positional, or a subcommand's name): then a stray word is
// one too many, not a sign that it takes flags only.
bool takes_words(const CLI::App& app) {
  if (!app.get_subcommands({}).empty()) return true;
  const std::vector<const CLI::Option*> opts = app.get_options();
  return std::any_of(opts.begin(), opts.end(), [](const CLI::Option* o) { return o->get_positional(); });
}

}  // namespace

std::string extras_message(const CLI::App& top, const CLI::App& train, const std::vector<std::string>& args) {
  const CLI::App* app = with_leftovers(top);
  if (app == nullptr) return "kiln: error: unexpected arguments (see kiln --help)";
  std::vector<std::string> extra = app->remaining();
  std::erase(extra, std::string("--"));
  const auto is_flag = [](const std::string& w) { return w.size() > 1 && w[0] == '-'; };
  // A command that takes no words hands those after its `--` back to its parent (CLI11 drops the `--`):
  // `kiln eval ... -- --zero` left --zero with kiln. They are the command's mistake, named as words
  // after --.
  const auto dashes = std::find(args.begin(), args.end(), std::string("--"));
  if (!app->get_subcommands().empty() && std::find(args.begin(), dashes, extra[0]) == dashes) {
    const CLI::App* deepest = app;
    while (!deepest->get_subcommands().empty()) deepest = deepest->get_subcommands()[0];
    const std::string cmd = command_path(*deepest);
    return cmd + ": error: unexpected argument '" + extra[0] + "' after -- (" +
           (takes_words(*deepest) ? "one argument too many" : cmd + " takes flags only") + "; see " + cmd + " --help)";
  }
  const std::string cmd = command_path(*app);
  // At the top level a first word that is no flag is a mistyped command (`kiln trian --out r`): named
  // before the flags that follow it, which are the command's.
  if (app->get_parent() == nullptr && !is_flag(extra[0]))
    return "kiln: error: '" + extra[0] + "' is not a kiln command (see kiln --help)";
  // The first flag among them names the mistake (its value, if any, follows it); a lone word is
  // named as what it is.
  const auto flag = std::find_if(extra.begin(), extra.end(), is_flag);
  if (flag == extra.end())
    return cmd + ": error: unexpected argument '" + extra[0] + "' (" +
           (takes_words(*app) ? "one argument too many" : cmd + " takes flags only") + "; see " + cmd + " --help)";
  const std::string name = flag->substr(0, flag->find('='));  // --zero=1 is --zero
  if (cmd == "kiln eval" && train.get_option_no_throw(name) != nullptr)
    return cmd + ": error: " + name + " is a kiln train flag (training only)";
  return cmd + ": error: " + name + " is not a flag of " + cmd + " (see " + cmd + " --help)";
}

std::optional<bool> strict_bool(const std::string& s) {
  std::string l = s;
  for (char& ch : l) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  if (l == "true" || l == "1") return true;
  if (l == "false" || l == "0") return false;
  return std::nullopt;
}

std::string bad_flag_value(const CLI::App& top, const std::vector<std::string>& args) {
  // CLI11 parses a flag's value by its own looser rule (`--augment=no` off, `--augment=2` on,
  // `--no-augment=yes` off) and hands an option only the value it made of it, so the words are read
  // here, before parsing. A word that names a command of the current one moves into it, as CLI11 does.
  const CLI::App* app = &top;
  // Words an option given without '=' (`--out`, `-o`) takes as its value whatever they are (`--out
  // --augment=no` names the folder '--augment=no'), as many as CLI11 takes unconditionally: read as
  // that option's value, not as a flag or a command.
  int values_owed = 0;
  for (const std::string& w : args) {
    if (values_owed > 0) {
      --values_owed;
      continue;
    }
    if (w == "--") break;  // what follows is not this command's (kiln launch's command, positionals)
    if (w.empty() || w[0] != '-') {
      for (const CLI::App* sub : app->get_subcommands({}))
        if (sub->check_name(w)) {
          app = sub;
          break;
        }
      continue;
    }
    const size_t eq = w.find('=');
    const bool is_long = w.rfind("--", 0) == 0;
    if (eq == std::string::npos || !is_long) {
      // `--out` or `-o` alone waits for its value; `-oDIR` and `-abc` carry theirs.
      if (is_long || w.size() == 2)
        if (const CLI::Option* opt = app->get_option_no_throw(w); opt != nullptr && opt->get_expected_max() != 0)
          values_owed = std::min(opt->get_type_size_min(), opt->get_items_expected_min());
      continue;
    }
    const std::string name = w.substr(0, eq), value = w.substr(eq + 1);
    const CLI::Option* opt = app->get_option_no_throw(name);
    if (opt == nullptr || opt->get_expected_max() != 0 || strict_bool(value).has_value()) continue;
    // `--help=...` is CLI11's to answer, as it was before this check.
    if (opt == app->get_help_ptr() || opt == app->get_help_all_ptr()) continue;
    const std::string cmd = command_path(*app);
    return cmd + ": error: " + w + ": " + name + " takes true or false (or 1, 0), got '" + value + "' (see " + cmd +
           " --help)";
  }
  return "";
}

std::string output_file_problem(const std::string& flag, const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return flag + " " + path + " is a directory: name the " + what;
  const fs::path parent = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  if (!fs::is_directory(parent, ec))
    return flag + " " + path + ": the directory " + parent.string() + " does not exist";
  if (::access(parent.c_str(), W_OK) != 0)
    return flag + " " + path + ": the directory " + parent.string() + " is not writable";
  return "";
}

std::string output_is_input(const std::string& out_flag, const std::string& out,
                            const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (out.empty() || !fs::exists(out, ec)) return "";
  for (const auto& in : inputs) {
    if (in.empty() || !fs::equivalent(in, out, ec)) continue;
    return out_flag + " " + out + " is the input " + (in == out ? std::string("itself") : in + " itself") +
           ": writing it would replace the file being read; write to another path";
  }
  return "";
}

std::string same_output(const std::string& flag_a, const std::string& a, const std::string& flag_b,
                        const std::string& b) {
  namespace fs = std::filesystem;
  if (a.empty() || b.empty()) return "";
  std::error_code ec, ec_a, ec_b;
  // Neither needs to exist: one path spelled two ways (./w, a/../w) is the same file to be; two
  // existing paths (a link, a hard link) are compared as files.
  const fs::path ca = fs::weakly_canonical(a, ec_a), cb = fs::weakly_canonical(b, ec_b);
  const bool same =
      (!ec_a && !ec_b && ca == cb) || (fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec));
  if (!same) return "";
  return flag_a + " " + a + " and " + flag_b + " " + b + " name the same file: the second written would replace the " +
         "first; write them to two paths";
}

namespace {
// Flags' names without the {value} each negated name carries (see add_on_off_flag).
class OnOffFormatter : public CLI::Formatter {
 public:
  explicit OnOffFormatter(const CLI::Formatter& f) : CLI::Formatter(f) {}
  std::string make_option_name(const CLI::Option* opt, bool is_positional) const override {
    std::string s = CLI::Formatter::make_option_name(opt, is_positional);
    if (is_positional) return s;  // only a flag's names carry braces
    for (size_t open; (open = s.find('{')) != std::string::npos;) {
      const size_t close = s.find('}', open);
      if (close == std::string::npos) break;
      s.erase(open, close - open + 1);
    }
    return s;
  }
};
}  // namespace

CLI::Option* add_on_off_flag(CLI::App& app, const std::string& names, bool& value, const std::string& help) {
  if (!std::dynamic_pointer_cast<OnOffFormatter>(app.get_formatter()))
    if (const auto f = std::dynamic_pointer_cast<CLI::Formatter>(app.get_formatter()))
      app.formatter(std::make_shared<OnOffFormatter>(*f));
  return app.add_flag(names, value, help)->option_text(value ? "(default: on)" : "(default: off)");
}

namespace {
std::string number_text(double v) {
  char b[64];
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15)
    std::snprintf(b, sizeof b, "%.0f", v);
  else
    std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// The check of a numeric flag's text: "" when it is a finite number in [lo, hi].
std::string check_number(const std::string& text, double lo, double hi, const std::string& want) {
  const char* s = text.c_str();
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (end == s || *end != '\0') return "expected a number " + want + ", got '" + text + "'";
  if (!std::isfinite(v)) return "must be a finite number " + want + ", got " + text;
  if (v < lo || v > hi) return "must be " + want + ", got " + text;
  return "";
}
}  // namespace

CLI::Validator at_least(double lo) {
  const std::string want = ">= " + number_text(lo);
  return CLI::Validator([lo, want](std::string& s) { return check_number(s, lo, HUGE_VAL, want); }, "NUMBER " + want);
}

CLI::Validator between(double lo, double hi) {
  const std::string want = "in " + number_text(lo) + ".." + number_text(hi);
  return CLI::Validator([lo, hi, want](std::string& s) { return check_number(s, lo, hi, want); }, "NUMBER " + want);
}

CLI::Validator u64_number() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const std::string want = "an integer in 0..18446744073709551615 (2^64 - 1)";
        if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
          return "expected " + want + ", got '" + s + "'";
        errno = 0;
        std::strtoull(s.c_str(), nullptr, 10);
        if (errno == ERANGE) return "must be " + want + ", got " + s;
        return "";
      },
      "UINT64");
}

int64_t max_threads() {
  const int64_t cpus = std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()));
  return std::min<int64_t>(4096, std::max<int64_t>(1024, 4 * cpus));  // 4096: the thread pool's own bound
}

}  // namespace kiln::tools
