// What the parts of the store share (not part of the store's interface).
// The store is split by what each part serves:
//   store.cpp          the send path (im_send) and the publisher
//   store_reads.cpp    sync, history, fetch, the fan-out's reads
//   store_markers.cpp  convs, ack, read
//   store_devices.cpp  hello, devices, tokens, backend API keys
//   store_admin.cpp    recall and the operator commands on conversations
//   store_presence.cpp typing's membership check, presence (contract 13)
//   store_common.cpp   the helpers below, probes, lab markers
// Each part names its statements in ONE table (a `Statements` array) and
// prepares them on the connection in one place (`prepare_all`) before its
// first use; libpqxx sends each to the server on its first execution and
// again after a reconnect.
#pragma once

#include "core/errors.hpp"
#include "core/log.hpp"
#include "core/protocol.hpp"
#include "store/store.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <pqxx/pqxx>

namespace im::store_detail {

/// im_change's answer (its code, seq, dup, changed, epoch) as the
/// contract's outcome of an edit or react in `conv` (store_changes.cpp:
/// the one mapping of its codes; im_write_group's rows carry the same).
Outcome<Store::SendResult> change_outcome(const std::string& conv, const pqxx::field& code, const pqxx::field& seq,
                                          const pqxx::field& dup, const pqxx::field& changed,
                                          const pqxx::field& epoch);

/// A named statement of one part of the store.
struct Statement {
    const char* name;
    std::string sql;
};
using Statements = std::vector<Statement>;

/// Defines every statement of `table` on `c` (idempotent: libpqxx keeps
/// the definitions per connection and prepares each lazily, once).
void prepare_all(pqxx::connection_base& c, const Statements& table);

// SQL fragments shared by the statements.
inline constexpr const char* ts_ms = "floor(extract(epoch from created_at) * 1000)::bigint";
// Fingerprints (contract section 6): sha256(conv || '\0' || body) and
// sha256(conv || '\0recall:' || target), computed by the database.
inline constexpr const char* send_fp =
    "sha256(convert_to($1, 'UTF8') || '\\x00'::bytea || convert_to($4, 'UTF8'))";
inline constexpr const char* recall_fp =
    "sha256(convert_to($1, 'UTF8') || '\\x00'::bytea || convert_to('recall:' || $4::text, 'UTF8'))";

struct ConvRow {
    std::string kind;
    std::int64_t next_seq = 1, epoch = 1, min_seq = 1, recall_window_ms = 0, push_full_max = 0;
};

/// The columns of a conversation row, in ConvRow's order.
inline constexpr const char* conv_columns = "kind, next_seq, epoch, min_seq, recall_window_ms, push_full_max";
/// Columns 0-5: kind, next_seq, epoch, min_seq, recall_window_ms, push_full_max.
ConvRow conv_row(const pqxx::row& row);

/// A user's membership periods in one conversation: read access is by seq.
struct Access {
    struct Period { std::int64_t from, to; }; // to = INT64_MAX when open
    std::vector<Period> periods;
    bool open = false;
    std::int64_t head = 0; // the highest seq this user may know of

    bool any() const { return !periods.empty(); }
    bool can_read(std::int64_t seq) const {
        for (auto& p : periods)
            if (seq >= p.from && seq <= p.to) return true;
        return false;
    }
};

/// "The caller's device still has its access" (section 4), as a condition
/// on `devices d`: the device proved at hello, with the token it proved, not
/// revoked. dev, user and tok are the parameter numbers of device id, user
/// id and token hash (hex). (im_send, schema/functions/im_send.sql, spells
/// the same rule in SQL.)
std::string device_valid_where(int dev, int user, int tok);
/// The same as a boolean expression.
std::string device_valid_sql(int dev, int user, int tok);

/// Columns: conv_id, seq, mid, kind, sender_user, body, target_seq,
/// subject_user, ts, epoch, client_msg_id, reply_to, emoji, react_on,
/// attachments (JSON text), erased (schema/017).
std::string event_columns();
/// `events_sql` (a statement selecting event_columns() of some events)
/// with what a msg shows of its later changes (contract section 12): edit
/// seq, body and ts, reactions_seq, recalled, the top reactions
/// (msg_changes.reactions_top, schema/018) and the emoji of the user in
/// parameter $viewer (for `me`). One statement, one snapshot, no query per
/// event: the events' rows and, after them, rows of changes (conv_id NULL)
/// from one index range scan each over [lo, hi]; event_rows takes them
/// apart, read_event puts them on the events. `lo` and `hi` (SQL over the
/// parameters) bound the seqs events_sql can return (a range read's bounds
/// rely on seqs being gap-free: Collected::whole refuses a page with a gap).
std::string with_changes(const std::string& events_sql, const std::string& lo, const std::string& hi, int viewer);
/// A page of sync (oldest first) or history (newest first): the events of
/// Store::event_range_sql with their changes; $5 is the reader.
std::string event_page_sql(bool newest_first);
/// The rows of a with_changes statement: its events in seq order (it has
/// no ORDER BY) and the changes of its range, each sorted by seq.
struct EventRows {
    std::vector<pqxx::row> rows;                               // the events
    std::vector<std::pair<std::int64_t, pqxx::row>> changes;   // msg_changes rows by msg seq
    std::vector<std::int64_t> recalled;                        // recalled msgs' seqs
    std::vector<std::pair<std::int64_t, std::string>> mine;    // the viewer's (seq, emoji)
};
EventRows event_rows(const pqxx::result& r, bool newest_first);
/// One event row (event_columns()), without later changes.
Event read_event(const pqxx::row& row);
/// An event row of a with_changes statement with the changes of its seq.
Event read_event(const pqxx::row& row, const EventRows& with);

/// A PostgreSQL text[] literal (a bound parameter): every element quoted,
/// `"` and `\` escaped; `at(i)` gives element i, nullptr for NULL.
template <class At>
std::string text_array_of(std::size_t n, At at) {
    std::string out = "{";
    for (std::size_t i = 0; i < n; ++i) {
        if (i) out += ',';
        const std::string* item = at(i);
        if (!item) {
            out += "NULL";
            continue;
        }
        out += '"';
        for (char ch : *item) {
            if (ch == '"' || ch == '\\') out += '\\';
            out += ch;
        }
        out += '"';
    }
    return out + "}";
}

inline std::string text_array(const std::vector<std::string>& items) {
    return text_array_of(items.size(), [&](std::size_t i) { return &items[i]; });
}

/// A failure the same request would meet on every retry (a data exception,
/// a constraint the request itself breaks; contract section 8).
bool deterministic(const pqxx::sql_error& e);

/// Maps database failures to UNAVAILABLE: the request key makes a resend safe.
/// With Rethrow, a unique violation escapes to the caller (send retries once).
template <class T, bool Rethrow = false, class F>
Outcome<T> guarded(const char* what, F&& f) {
    try {
        return f();
    } catch (const pqxx::unique_violation& e) {
        if constexpr (Rethrow) throw;
        log_warn("db_conflict", {{"op", what}, {"err", e.what()}});
        return unavailable();
    } catch (const pqxx::sql_error& e) {
        // The server answered with an error: nothing was committed. One the
        // request would meet on every retry is terminal (contract section 8).
        if (deterministic(e)) {
            if constexpr (Rethrow) throw;
            log_warn("db_rejected", {{"op", what}, {"sqlstate", e.sqlstate()}, {"err", e.what()}});
            return invalid("the database rejected this request (" + e.sqlstate() + ")");
        }
        log_warn("db_error", {{"op", what}, {"sqlstate", e.sqlstate()}, {"err", e.what()}});
        return unavailable();
    } catch (const pqxx::in_doubt_error& e) {
        log_warn("db_in_doubt", {{"op", what}, {"err", e.what()}});
        return unavailable("commit outcome unknown; retry with the same request");
    } catch (const pqxx::broken_connection& e) {
        log_warn("db_broken", {{"op", what}, {"err", e.what()}});
        return unavailable();
    } catch (const std::exception& e) {
        log_warn("db_error", {{"op", what}, {"err", e.what()}});
        return unavailable();
    }
}

/// Device tokens never leave the process: PostgreSQL sees (and logs, and
/// shows in pg_stat_activity) only their SHA-256, as hex.
std::string token_hash_hex(const std::string& token);
/// 32 random bytes as hex.
std::string random_token();

inline Error stale_install() { return {Code::stale_install, "a newer install of this device exists"}; }

} // namespace im::store_detail

namespace im::store_detail {

/// One NOTIFY on the PostgreSQL bus inside `tx` (delivered exactly when it
/// commits).
void notify(pqxx::transaction_base& tx, const std::string& payload);

/// Operator commands announce their commits either inside the transaction
/// (PostgreSQL NOTIFY) or, when the CLI runs with another bus, into `sink`,
/// published by the caller after COMMIT.
inline void admin_note(pqxx::transaction_base& tx, Notes* sink, const std::string& payload) {
    if (sink) sink->push_back(payload);
    else notify(tx, payload);
}

/// An operator's id: 1-64 characters of [A-Za-z0-9._:-], else AdminError::invalid.
void need_id(const std::string& what, const std::string& id);

} // namespace im::store_detail
