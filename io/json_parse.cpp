#include "io/json_parse.h"

#include <set>
#include <vector>

#include "base/error.h"

namespace kiln::io {

nlohmann::json parse_json_bounded(const char* text, size_t n, int max_depth,
                                  const std::function<std::string()>& too_deep, const std::string& not_json,
                                  const JsonEventHook& hook) {
  using json = nlohmann::json;
  int depth = 0;
  auto on_event = [&](int, json::parse_event_t event, json& parsed) -> bool {
    if (event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) {
      if (++depth > max_depth) KILN_FAIL(too_deep());
    } else if (event == json::parse_event_t::object_end || event == json::parse_event_t::array_end) {
      --depth;
    }
    if (hook) hook(event, parsed);
    return true;
  };
  try {
    return json::parse(text, text + n, on_event, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    KILN_FAIL(not_json, ": ", e.what());
  }
}

nlohmann::json parse_json_file_text(const std::string& text, const std::string& what) {
  using json = nlohmann::json;
  struct Frame {
    std::set<std::string> keys;
    std::string owner;  // the key this object is the value of ("" for the root or an array's element)
    std::string last_key;
  };
  std::vector<Frame> frames;
  bool in_array = false;     // the value being parsed is an array's element (then its object has no owner)
  std::vector<bool> arrays;  // per open object or array: true for an array
  auto on_event = [&](json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        frames.push_back({{}, frames.empty() || in_array ? std::string() : frames.back().last_key, {}});
        arrays.push_back(false);
        in_array = false;
        break;
      case json::parse_event_t::array_start:
        arrays.push_back(true);
        in_array = true;
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (event == json::parse_event_t::object_end) frames.pop_back();
        arrays.pop_back();
        in_array = !arrays.empty() && arrays.back();
        break;
      case json::parse_event_t::key: {
        Frame& f = frames.back();
        const std::string& k = parsed.get_ref<const std::string&>();
        KILN_CHECK(f.keys.insert(k).second, what, ": key '", k, "' appears twice",
                   f.owner.empty() ? std::string() : " in '" + f.owner + "'",
                   " (one key per setting; JSON keeps only the last)");
        f.last_key = k;
        break;
      }
      default: break;
    }
  };
  return parse_json_bounded(
      text.data(), text.size(), 64, [&] { return detail::str_cat(what, ": nests JSON deeper than 64 levels"); },
      what + ": not valid JSON", on_event);
}

}  // namespace kiln::io
