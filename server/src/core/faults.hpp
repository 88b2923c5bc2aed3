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

enum class FaultKind { crash, drop_reply, unavailable, delay, skip };

struct FaultAction {
    FaultKind kind = FaultKind::crash;
    std::chrono::milliseconds delay{0};
    int remaining = -1; // -1: every time
};

/// The named points of spec/server.md, plus the lab's points beyond send
/// (docs/acceptance.md lists what each action does at each point).
inline constexpr std::string_view fault_points[] = {
    // send
    "store.before_insert", "store.before_commit", "api.after_send_commit",
    // recall: the recall event appended, not committed / committed, reply not yet sent
    "store.recall_before_commit", "api.after_recall_commit",
    // ack and read: marker written, not committed
    "store.ack_before_commit", "store.read_before_commit",
    // retention purge (imserver admin purge): tombstones written, events not yet
    // deleted / both done and min_seq raised, not committed
    "store.purge_after_tombstones", "store.purge_before_commit", "store.erase_before_commit",
    // a gateway's fan-out: bus notifications received, not yet pushed to
    // subscribers (unavailable = they are lost; subscribers get resync)
    "notify.before_publish",
    // a send worker has taken its group (conversations marked, slot held),
    // nothing sent yet (`unavailable` = the runs are answered UNAVAILABLE and
    // the worker throws out of its loop, as an allocation failure would)
    "send.after_take",
    // Negative controls of the acceptance lab (action `skip` only): each
    // breaks exactly one rule of the contract while armed.
    "rule.cursor_ahead",       // sync answers a page for `after` beyond head
    "rule.epoch",              // sync ignores the caller's stale epoch
    "rule.membership_periods", // sync treats a closed membership period as open
    "rule.stale_install",      // a superseded install is served as current
    "rule.recall_window",      // recall ignores the window
    "rule.read_hint",          // a read marker's hint is not sent to the user's other devices
    "rule.push_hint",          // every group gets full `event` pushes, whatever its push_full_max
    "rule.goaway",             // a draining gateway closes connections without `goaway`
    "rule.commit_before_crash",   // a crash armed at store.before_insert/before_commit fires after the COMMIT
    "rule.unavailable_terminal",  // an UNAVAILABLE answer goes out as the terminal INVALID_ARGUMENT
    "rule.recall_dedup",          // a recall's request key is never found: a repeated recall is judged anew
    "rule.limits",                // the codec's field bounds (cmid, body, limit, after) are not checked
    "rule.typing_push_full",      // typing is forwarded in conversations above push_full_max
    "rule.presence_strangers",    // presence answers users who share no conversation with the caller
    "rule.send_rate",             // --send-rate is not applied: no write is answered RATE_LIMITED
    "rule.webhook_retry",         // a failed webhook delivery moves the cursor on as if delivered (no retry)
    "rule.attachment_visibility", // any user may download any complete upload (no contract-5 check)
    // ... and in the send function: the lab calls its variant im_lab_send_<rule> (lab_schema.hpp):
    "rule.send_membership",    // a stranger's send is appended (no membership check)
    "rule.same_error",         // an unknown conversation answers apart from a non-member's
    "rule.request_hash",       // a reused cmid is a duplicate whatever its body
    "rule.fresh_dup",          // a fresh append is answered dup:true
    "rule.send_prev",          // a send is appended though the message its `prev` names is not
    "rule.send_dedup",         // the request-key lookup is skipped: a repeated cmid inserts a second event
    "rule.fingerprint_body_only", // the fingerprint is of conv and body only: another reply_to is a duplicate
    "rule.send_mute",          // a muted member's send is appended (no mute check; server.md, moderation)
    // ... and in the edit/react function, its variant im_lab_change_<rule>:
    "rule.edit_window",        // an edit is judged without its window
    "rule.react_noop",         // a reaction already as asked appends an event anyway
    // ... and in sync:
    "rule.page_cursor",        // next_after is the head read after the page, not the page's end
    // ... and in the attachments store:
    "rule.attachment_resume"}; // GET /v1/uploads/{id} of an interrupted upload drops its pieces: it restarts at 0

/// True for the rule.* points, which take only the `skip` action.
bool is_rule_point(std::string_view point);

/// Parses "POINT=ACTION[:COUNT]" with ACTION one of crash, drop_reply,
/// unavailable, delay:MS (any point but rule.*) or skip (rule.* points only). Returns an error message or nothing.
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

    /// True while the rule.* point is armed (consumes one COUNT).
    bool broken(std::string_view rule) { return enabled_ && hit(rule) == FaultKind::skip; }

    /// Takes one `crash` armed at `point` off it without crashing (consumes
    /// one COUNT); false when none is armed there. For rule.commit_before_crash,
    /// which moves that crash behind the COMMIT.
    bool take_crash(std::string_view point);
    /// Exits now as a `crash` action does (status 70).
    [[noreturn]] static void crash_now();

private:
    bool enabled_;
    std::mutex mu_;
    std::map<std::string, FaultAction, std::less<>> armed_;
};

/// Lab-only negative controls; only settable with --enable-faults.
struct LabSwitches {
    bool no_unique_index = false;        // check-then-insert without events_idempotency
    bool purge_without_tombstones = false;
    bool erase_without_tombstones = false; // a user's erase keeps no request keys (14-mute-redact-erase's control)
    bool no_resync = false;              // a gateway that lost LISTEN does not push `resync`
};

} // namespace im
