// Fault injection for the acceptance lab. Nothing here is reachable unless
// the server was started with --enable-faults (see FaultRegistry::enabled).
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace im {

enum class FaultKind { crash, drop_reply, unavailable, delay };

struct FaultAction {
    FaultKind kind = FaultKind::crash;
    std::chrono::milliseconds delay{0};
    int remaining = -1; // -1: every time
};

/// The named points of spec/server.md.
inline constexpr std::string_view fault_points[] = {
    "store.before_insert", "store.before_commit", "api.after_send_commit"};

/// Parses "POINT=ACTION[:COUNT]" with ACTION one of crash, drop_reply,
/// unavailable, delay:MS. Returns an error message or nothing.
std::optional<std::string> parse_fault_spec(std::string_view spec, std::string& point, FaultAction& action);

class FaultRegistry {
public:
    explicit FaultRegistry(bool enabled) : enabled_(enabled) {}
    bool enabled() const { return enabled_; }

    /// Arms a point ("off" clears it). Fails when faults are disabled.
    std::optional<std::string> arm(std::string_view spec);
    void clear();

    /// Called at a point; returns the action to take now, if any. A `crash`
    /// never returns: the process _exits at once. `delay` sleeps here (the
    /// caller is a database worker thread, never an I/O thread).
    std::optional<FaultKind> hit(std::string_view point);

private:
    bool enabled_;
    std::mutex mu_;
    std::map<std::string, FaultAction, std::less<>> armed_;
};

/// Lab-only negative controls; only settable with --enable-faults.
struct LabSwitches {
    bool no_unique_index = false;        // check-then-insert without events_idempotency
    bool purge_without_tombstones = false;
};

} // namespace im
