// The wire codec: JSON text frame <-> typed requests and replies.
// Pure (no sockets, no database), so it is tested with tables of frames.
// Every limit of contract section 9 is enforced here and only here.
#pragma once

#include "core/errors.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace im {

inline constexpr std::size_t max_frame_bytes = 64 * 1024;
/// An unknown request type is echoed in its error only up to this length.
inline constexpr std::size_t max_echoed_type_bytes = 32;
inline constexpr std::size_t max_rid_chars = 64;
inline constexpr std::size_t max_cmid_chars = 64;
inline constexpr std::size_t max_body_code_points = 4000;
/// react.emoji: 1-64 bytes of UTF-8, no control characters (contract section 12).
inline constexpr std::size_t max_emoji_bytes = 64;
/// Distinct emoji one user may have on one message (contract section 12),
/// and the entries of a msg event's `reactions`.
inline constexpr std::size_t max_reactions = 20;
/// Contract section 12: att_ids a send may carry.
inline constexpr std::size_t max_message_attachments = 10;
inline constexpr std::size_t max_id_chars = 64; // conv ids, install ids
/// hello.token and refresh.token: a random device token or a JWT.
inline constexpr std::size_t max_token_chars = 4096;
inline constexpr std::int64_t default_sync_limit = 50;
inline constexpr std::int64_t max_sync_limit = 200;
inline constexpr std::int64_t default_convs_limit = 100;
inline constexpr std::int64_t max_convs_limit = 500;
inline constexpr std::size_t max_presence_users = 500; // presence.users (contract section 13)
/// Room kept in every page for its envelope (type, conv, cursors, a rid of
/// up to 64 characters even when each is escaped as \uXXXX): the items of a
/// page may use max_frame_bytes - frame_envelope_reserve bytes together.
inline constexpr std::size_t frame_envelope_reserve = 2048;
inline constexpr std::size_t page_item_budget = max_frame_bytes - frame_envelope_reserve;

namespace req {
struct Hello { std::string token, install; };
// `prev` (optional, empty when absent): the cmid of the caller's previous
// message in this conversation, which must be committed before this one may
// be (pipelined sends keep their order; docs/protocol.md, "Send").
struct Send {
    std::string conv, cmid, body, prev;
    std::optional<std::int64_t> reply_to; // contract section 12: a seq of a msg the caller may read
    /// Contract section 12: 1-10 distinct att_ids (canonical lowercase
    /// UUIDs), in the order given; empty when absent.
    std::vector<std::string> attachments;
};
struct Sync { std::string conv; std::int64_t after = 0; std::int64_t limit = default_sync_limit; std::optional<std::int64_t> epoch; };
struct Ack { std::string conv; std::int64_t seq = 0; };
struct Read { std::string conv; std::int64_t seq = 0; };
struct Recall { std::string conv; std::int64_t target = 0; std::string cmid; };
struct History { std::string conv; std::int64_t before = 0; std::int64_t limit = default_sync_limit; std::optional<std::int64_t> epoch; };
struct Convs { std::string after; std::int64_t limit = default_convs_limit; };
struct Fetch { std::string conv; std::int64_t seq = 0; };
struct Sub {};
/// A new JWT for the open connection (contract section 4a).
struct Refresh { std::string token; };
/// Contract section 12: a new body for one's own msg `target`.
struct Edit { std::string conv; std::int64_t target = 0; std::string cmid, body; };
/// Contract section 12: the caller's reaction `emoji` on msg `target` set to `on`.
struct React { std::string conv; std::int64_t target = 0; std::string cmid, emoji; bool on = true; };
/// Contract section 13: typing in `conv` started (on) or stopped.
struct Typing { std::string conv; bool on = false; };
/// Contract section 13: the presence of `users` (1-500 distinct ids, sorted),
/// which also become the connection's watch list.
struct Presence { std::vector<std::string> users; };
} // namespace req

using Request = std::variant<req::Hello, req::Send, req::Sync, req::Ack, req::Read,
                             req::Recall, req::Convs, req::Fetch, req::Sub, req::History, req::Refresh,
                             req::Edit, req::React, req::Typing, req::Presence>;

/// The request type name as it appears in `t` (for metrics and logs).
std::string_view request_name(const Request& r);

namespace req {
/// One item of a run of writes (send_scheduler.hpp): a send, or an edit or
/// react of contract section 12 riding the same run and group commit.
using Write = std::variant<Send, Edit, React>;
} // namespace req
/// The conversation a write goes to.
inline const std::string& write_conv(const req::Write& w) {
    return std::visit([](const auto& r) -> const std::string& { return r.conv; }, w);
}

struct Parsed {
    std::optional<std::string> rid;       // echoed on the reply when readable
    std::string type;                     // `t` when readable, for metrics
    std::variant<Request, Error> body;
};

/// The field bounds of contract section 9 that parse_request checks. The
/// contract's are the only ones production uses; the acceptance lab's
/// negative control `rule.limits` (ws_session.cpp, behind --enable-faults)
/// parses with looser ones to prove 04-limits sees a server that accepts
/// what it must refuse.
struct FieldBounds {
    std::size_t min_cmid_chars = 1, max_cmid_chars = im::max_cmid_chars;
    std::size_t min_body_code_points = 1, max_body_code_points = im::max_body_code_points;
    std::int64_t min_limit = 1;  // sync, history, convs
    std::int64_t min_after = 0;  // sync
};
inline constexpr FieldBounds contract_bounds{};

/// Parses and validates one text frame.
Parsed parse_request(std::string_view frame, const FieldBounds& bounds = contract_bounds);

/// Validation helpers, exposed for the admin CLI and tests.
bool valid_id(std::string_view id);                       // [A-Za-z0-9._:-]{1,64}
std::optional<std::size_t> utf8_code_points(std::string_view s); // nullopt if invalid

// ---- replies and pushes -------------------------------------------------

/// Contract section 12: what a page, a fetch or a push shows of a msg's
/// later changes, as of the snapshot that read it.
struct EditState { std::int64_t seq = 0; std::string body; std::int64_t ts = 0; };
struct ReactionCount { std::string emoji; std::int64_t count = 0; bool me = false; };

/// An attachment as a msg event carries it (contract section 12).
struct AttachmentRef {
    std::string att_id, name, mime;
    std::int64_t size = 0;
    std::string sha256;
};
/// The list as the store keeps it (events.attachments, im_send's r_atts):
/// a JSON array of {att_id, name, mime, size, sha256}; empty for "" or a
/// malformed text.
std::vector<AttachmentRef> attachments_from_json(std::string_view text);
/// 36 characters, the canonical lowercase text form of a UUID.
bool valid_att_id_text(std::string_view id);

struct Event {
    std::string conv;
    std::int64_t seq = 0;
    std::string mid;
    std::string kind;                      // msg | recall | join | leave | edit | reaction
    std::string sender;
    std::optional<std::string> body;       // msg | edit
    std::optional<std::int64_t> target;    // recall | edit | reaction
    std::optional<std::int64_t> reply_to;  // msg (section 12)
    std::optional<std::string> emoji;      // reaction
    std::optional<bool> on;                // reaction
    // msg only, section 12 "What a page shows of later changes"
    std::optional<EditState> edit;
    std::vector<ReactionCount> reactions;  // most counted first, at most max_reactions
    std::optional<std::int64_t> reactions_seq;
    bool recalled = false;
    /// A user's erase removed its content (schema/017): no body, emoji,
    /// attachments or cmid; shown as "erased": true (docs/protocol.md).
    bool erased = false;
    std::optional<std::string> user;       // join | leave
    std::optional<std::string> cmid;       // msg | recall: the sender's request key
    std::int64_t ts = 0;                   // database commit clock, ms
    std::int64_t epoch = 1;
    /// msg (section 12): its attachments in the order sent.
    std::vector<AttachmentRef> attachments;
};

/// A page's events written once. The store writes each event as it takes
/// it and measures it against the frame budget by the bytes written (an
/// event that does not fit is dropped again); the page's frame copies the
/// list instead of writing every event a second time (docs/benchmarks.md,
/// "Each event written once").
class EventListWriter {
public:
    /// Writes ev after the events added; returns the bytes it takes inside
    /// a page's list (its JSON and a separator), as encoded_size(ev).
    std::size_t add(const Event& ev);
    /// Removes the event added last (none: nothing).
    void drop_last();
    std::size_t count() const { return starts_.size(); }
    /// The list as a page carries it, "[ev,ev,...]": the events in the
    /// order added, or in the reverse order.
    std::string list(bool reversed) const;

private:
    std::string text_;                // the events' JSON back to back
    std::vector<std::size_t> starts_; // where each begins in text_
};

struct Welcome { std::string user, device, gateway; std::int64_t server_time = 0; };
struct Sent { std::string conv; std::int64_t seq = 0; std::string mid; bool dup = false; std::int64_t epoch = 1; };
struct Page {
    std::string conv;
    std::vector<Event> events;
    /// `events` as a page's list, written by EventListWriter::list, for
    /// `events_text_count` events; the frame copies it when that count is
    /// events.size() (else it writes `events`).
    std::string events_text;
    std::size_t events_text_count = 0;
    std::int64_t next_after = 0;
    bool has_more = false;
    std::int64_t head = 0;
    std::int64_t min_seq = 1;
    bool trimmed = false;
    std::int64_t epoch = 1;
};
/// A `history` page: same frame type as sync's, with `oldest`/`has_older`.
struct HistoryPage {
    std::string conv;
    std::vector<Event> events;
    std::string events_text; // as Page's
    std::size_t events_text_count = 0;
    std::int64_t oldest = 0;
    bool has_older = false;
    std::int64_t head = 0;
    std::int64_t min_seq = 1;
    bool trimmed = false;
    std::int64_t epoch = 1;
};
struct Acked { std::string conv; std::int64_t delivered = 0; };
struct ReadOk { std::string conv; std::int64_t read = 0; };
struct Recalled { std::string conv; std::int64_t seq = 0; bool dup = false; };
struct Edited { std::string conv; std::int64_t seq = 0; bool dup = false; std::int64_t epoch = 1; };
/// `seq` empty (null on the wire): an on:false that found nothing to remove.
struct Reacted {
    std::string conv;
    std::optional<std::int64_t> seq;
    bool dup = false, changed = false;
    std::int64_t epoch = 1;
};
struct ConvInfo {
    std::string conv, kind;
    std::int64_t head = 0, delivered = 0, read = 0, unread = 0, epoch = 1, min_seq = 1;
};
struct ConvList { std::vector<ConvInfo> convs; std::string next_after; bool has_more = false; };
struct Fetched { Event ev; };
struct Subscribed {};
struct Refreshed { std::int64_t exp = 0; }; // the new token's `exp`, ms
struct TypingOk {};
/// One user's presence (contract section 13); last_seen unset: never seen
/// online since presence was recorded (sent as null).
struct PresenceInfo { std::string user; bool online = false; std::optional<std::int64_t> last_seen; };
struct PresenceList { std::vector<PresenceInfo> users; };

using Reply = std::variant<Welcome, Sent, Page, Acked, ReadOk, Recalled, ConvList, Fetched, Subscribed, HistoryPage,
                           Refreshed, Edited, Reacted, TypingOk, PresenceList>;

std::string encode_reply(const Reply& r, const std::optional<std::string>& rid);
/// `retry_ms`: RATE_LIMITED's wait before a retry may succeed.
std::string encode_error(const Error& e, const std::optional<std::string>& rid,
                         std::optional<std::int64_t> retry_ms = std::nullopt);

/// Bytes an item takes inside a page's list (its JSON plus a separator):
/// the store cuts pages with these so no frame passes max_frame_bytes.
std::size_t encoded_size(const Event& ev);
std::size_t encoded_size(const ConvInfo& c);

std::string encode_event_push(const Event& ev);
/// The event as every page shows it, one JSON object (no frame around it).
std::string encode_event(const Event& ev);
std::string encode_hint(std::string_view conv, std::int64_t head, std::int64_t epoch,
                        std::optional<std::int64_t> read);
std::string encode_resync();
std::string encode_goaway(std::string_view reason, std::optional<std::int64_t> retry_ms);
/// Contract section 13: {"t":"typing","conv","user","on"} and
/// {"t":"presence","user","online","last_seen"}.
std::string encode_typing_push(std::string_view conv, std::string_view user, bool on);
std::string encode_presence_push(const PresenceInfo& p);
/// {"t":"token_expiring","exp":<ms>}: the connection's JWT runs out at exp.
std::string encode_token_expiring(std::int64_t exp_ms);

} // namespace im
