#include "io/json_parse.h"

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

}  // namespace kiln::io
