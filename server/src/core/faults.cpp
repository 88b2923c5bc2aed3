#include "core/faults.hpp"

#include <charconv>
#include <thread>
#include <unistd.h>

namespace im {

namespace {
bool parse_int(std::string_view s, long long& out) {
    if (s.empty()) return false;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && p == s.data() + s.size();
}
} // namespace

namespace {
// Points beside faults.hpp's list (kept here so that adding one rebuilds one
// file; fold them into fault_points when that header changes anyway).
constexpr std::string_view more_fault_points[] = {
    "rule.attachment_resume", // GET /v1/uploads/{id} of an interrupted upload drops its pieces: it restarts at 0
};
} // namespace

bool is_rule_point(std::string_view point) { return point.substr(0, 5) == "rule."; }

std::optional<std::string> parse_fault_spec(std::string_view spec, std::string& point, FaultAction& action) {
    auto eq = spec.find('=');
    if (eq == std::string_view::npos) return "fault must be POINT=ACTION[:COUNT]";
    point = std::string(spec.substr(0, eq));
    bool known = false;
    for (auto p : fault_points) known = known || p == point;
    for (auto p : more_fault_points) known = known || p == point;
    if (!known) return "unknown fault point '" + point + "'";
    std::string_view rest = spec.substr(eq + 1);
    auto take = [&rest]() {
        auto colon = rest.find(':');
        std::string_view head = rest.substr(0, colon);
        rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
        return head;
    };
    std::string_view kind = take();
    action = FaultAction{};
    if (kind != "off" && (kind == "skip") != is_rule_point(point))
        return is_rule_point(point) ? "a rule.* point takes only the action skip"
                                    : "skip is only for the rule.* points";
    if (kind == "crash") action.kind = FaultKind::crash;
    else if (kind == "skip") action.kind = FaultKind::skip;
    else if (kind == "drop_reply") action.kind = FaultKind::drop_reply;
    else if (kind == "unavailable") action.kind = FaultKind::unavailable;
    else if (kind == "delay") {
        action.kind = FaultKind::delay;
        long long ms = 0;
        if (!parse_int(take(), ms) || ms < 0 || ms > 600000) return "delay needs :MS (0-600000)";
        action.delay = std::chrono::milliseconds(ms);
    } else if (kind == "off") {
        action.remaining = 0;
        return std::nullopt;
    } else {
        return "unknown fault action '" + std::string(kind) + "'";
    }
    if (!rest.empty()) {
        long long count = 0;
        if (!parse_int(rest, count) || count < 1) return "fault COUNT must be a positive integer";
        action.remaining = static_cast<int>(count);
    }
    return std::nullopt;
}

std::optional<std::string> FaultRegistry::arm(std::string_view spec) {
    if (!enabled_) return "fault injection is disabled (start with --enable-faults)";
    std::string point;
    FaultAction action;
    if (auto e = parse_fault_spec(spec, point, action)) return e;
    std::lock_guard lk(mu_);
    if (action.remaining == 0) armed_.erase(point);
    else armed_[point] = action;
    return std::nullopt;
}

void FaultRegistry::clear() {
    std::lock_guard lk(mu_);
    armed_.clear();
}

bool FaultRegistry::take_crash(std::string_view point) {
    if (!enabled_) return false;
    std::lock_guard lk(mu_);
    auto it = armed_.find(point);
    if (it == armed_.end() || it->second.kind != FaultKind::crash) return false;
    if (it->second.remaining > 0 && --it->second.remaining == 0) armed_.erase(it);
    return true;
}

void FaultRegistry::crash_now() { ::_exit(70); }

std::optional<FaultKind> FaultRegistry::hit(std::string_view point) {
    if (!enabled_) return std::nullopt;
    FaultAction a;
    {
        std::lock_guard lk(mu_);
        auto it = armed_.find(point);
        if (it == armed_.end()) return std::nullopt;
        a = it->second;
        if (it->second.remaining > 0 && --it->second.remaining == 0) armed_.erase(it);
    }
    switch (a.kind) {
    case FaultKind::crash:
        crash_now();
    case FaultKind::delay:
        std::this_thread::sleep_for(a.delay);
        return std::nullopt;
    default:
        return a.kind;
    }
}

} // namespace im
