#include "store.hpp"

#include "db_pool.hpp"
#include "digest.hpp"
#include "lab_schema.hpp"
#include "log.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pqxx/pqxx>

#include <algorithm>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string_view>
#include <utility>

namespace im {

namespace {

// SQL fragments shared by the statements below.
constexpr const char* ts_ms = "floor(extract(epoch from created_at) * 1000)::bigint";
// Fingerprints (contract section 6): sha256(conv || '\0' || body) and
// sha256(conv || '\0recall:' || target), computed by the database.
constexpr const char* send_fp = "sha256(convert_to($1, 'UTF8') || '\\x00'::bytea || convert_to($4, 'UTF8'))";
constexpr const char* recall_fp =
    "sha256(convert_to($1, 'UTF8') || '\\x00'::bytea || convert_to('recall:' || $4::text, 'UTF8'))";

struct ConvRow {
    std::string kind;
    std::int64_t next_seq = 1, epoch = 1, min_seq = 1, recall_window_ms = 0, push_full_max = 0;
};

// Columns 0-5: kind, next_seq, epoch, min_seq, recall_window_ms, push_full_max.
ConvRow conv_row(const pqxx::row& row) {
    ConvRow c;
    c.kind = row[0].c_str();
    c.next_seq = row[1].as<std::int64_t>();
    c.epoch = row[2].as<std::int64_t>();
    c.min_seq = row[3].as<std::int64_t>();
    c.recall_window_ms = row[4].as<std::int64_t>();
    c.push_full_max = row[5].as<std::int64_t>();
    return c;
}

std::optional<ConvRow> load_conv(pqxx::transaction_base& tx, const std::string& conv, bool lock) {
    auto r = tx.exec_params(std::string("SELECT kind, next_seq, epoch, min_seq, recall_window_ms, push_full_max "
                                        "FROM conversations WHERE conv_id = $1") +
                                (lock ? " FOR UPDATE" : ""),
                            conv);
    if (r.empty()) return std::nullopt;
    return conv_row(r[0]);
}

// A user's membership periods in one conversation: read access is by seq.
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

Access load_access(pqxx::transaction_base& tx, const std::string& conv, const std::string& user,
                   std::int64_t next_seq) {
    Access a;
    auto r = tx.exec_params("SELECT from_seq, to_seq FROM membership_periods "
                            "WHERE conv_id = $1 AND user_id = $2 ORDER BY from_seq",
                            conv, user);
    std::int64_t last_to = 0;
    for (const auto& row : r) {
        Access::Period p{row[0].as<std::int64_t>(), INT64_MAX};
        if (row[1].is_null()) a.open = true;
        else {
            p.to = row[1].as<std::int64_t>();
            last_to = std::max(last_to, p.to);
        }
        a.periods.push_back(p);
    }
    // A former member learns nothing of traffic after their last period.
    a.head = a.open ? next_seq - 1 : last_to;
    return a;
}

// "The caller's device still has its access" (section 4), as a condition
// on `devices d`: the device proved at hello, with the token it proved, not
// revoked. $dev, $user and $tok are the parameter numbers of device id,
// user id and token hash (hex). (im_send, schema/functions/im_send.sql,
// spells the same rule in SQL.)
std::string device_valid_where(int dev, int user, int tok) {
    return "d.device_id = $" + std::to_string(dev) + " AND d.user_id = $" + std::to_string(user) +
           " AND d.token_sha256 = decode($" + std::to_string(tok) + ", 'hex') AND d.revoked_at IS NULL";
}

// The same as a boolean expression.
std::string device_valid_sql(int dev, int user, int tok) {
    return "EXISTS (SELECT 1 FROM devices d WHERE " + device_valid_where(dev, user, tok) + ")";
}

// The caller's device still valid (section 4: a revoked device reads no
// more events), the conversation row and the caller's periods, in one
// statement (one round trip, one snapshot): what every read request starts
// with. A read is ordered by this statement: one that began before a
// revocation committed is answered as of then.
Outcome<std::pair<ConvRow, Access>> load_conv_access(pqxx::transaction_base& tx, const std::string& conv,
                                                     const Identity& who) {
    static const std::string sql =
        "SELECT c.kind, c.next_seq, c.epoch, c.min_seq, c.recall_window_ms, c.push_full_max, "
        "p.from_seq, p.to_seq, p.from_seq IS NOT NULL, dv.ok "
        "FROM (SELECT " + device_valid_sql(3, 2, 4) + " AS ok) dv "
        "LEFT JOIN conversations c ON c.conv_id = $1 "
        "LEFT JOIN membership_periods p ON p.conv_id = c.conv_id AND p.user_id = $2 "
        "ORDER BY p.from_seq";
    auto r = tx.exec_params(sql, conv, who.user, who.device, who.token_sha256);
    if (who.backend) { // the backend API: no device, every event of the conversation
        if (r[0][0].is_null()) return Error{Code::not_found, "no such conversation"};
        ConvRow c = conv_row(r[0]);
        Access a;
        a.periods.push_back({1, INT64_MAX});
        a.open = true;
        a.head = c.next_seq - 1;
        return std::make_pair(std::move(c), std::move(a));
    }
    if (!r[0][9].as<bool>()) return device_revoked();
    if (r[0][0].is_null()) return not_member(); // no such conversation
    ConvRow c = conv_row(r[0]);
    Access a;
    std::int64_t last_to = 0;
    for (const auto& row : r) {
        if (!row[8].as<bool>()) continue; // no period: not a member
        Access::Period p{row[6].as<std::int64_t>(), INT64_MAX};
        if (row[7].is_null()) a.open = true;
        else {
            p.to = row[7].as<std::int64_t>();
            last_to = std::max(last_to, p.to);
        }
        a.periods.push_back(p);
    }
    a.head = a.open ? c.next_seq - 1 : last_to;
    return std::make_pair(std::move(c), std::move(a));
}

Event read_event(const pqxx::row& row) {
    // Columns: conv_id, seq, mid, kind, sender_user, body, target_seq, subject_user, ts, epoch, client_msg_id
    Event ev;
    ev.conv = row[0].c_str();
    ev.seq = row[1].as<std::int64_t>();
    ev.mid = row[2].c_str();
    ev.kind = row[3].c_str();
    if (!row[4].is_null()) ev.sender = row[4].c_str();
    if (!row[5].is_null()) ev.body = std::string(row[5].c_str());
    if (!row[6].is_null()) ev.target = row[6].as<std::int64_t>();
    if (!row[7].is_null()) {
        ev.user = std::string(row[7].c_str());
        if (ev.sender.empty()) ev.sender = *ev.user;
    }
    ev.ts = row[8].as<std::int64_t>();
    ev.epoch = row[9].as<std::int64_t>();
    if (!row[10].is_null()) ev.cmid = std::string(row[10].c_str());
    return ev;
}

std::string event_columns() {
    return std::string("conv_id, seq, mid::text, kind, sender_user, body, target_seq, subject_user, ") + ts_ms +
           ", epoch, client_msg_id";
}

// A PostgreSQL text[] literal (a bound parameter): every element quoted,
// `"` and `\` escaped; `at(i)` gives element i, nullptr for NULL.
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

std::string text_array(const std::vector<std::string>& items) {
    return text_array_of(items.size(), [&](std::size_t i) { return &items[i]; });
}

// A failure the same request would meet on every retry (a data exception,
// a constraint the request itself breaks; contract section 8).
bool deterministic(const pqxx::sql_error& e) {
    const std::string& state = e.sqlstate();
    return (state.rfind("22", 0) == 0 || state.rfind("23", 0) == 0) && state != "23505";
}

// Maps database failures to UNAVAILABLE: the request key makes a resend safe.
// With Rethrow, a unique violation escapes to the caller (send retries once).
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

void notify(pqxx::transaction_base& tx, const std::string& payload) {
    tx.exec_params("SELECT pg_notify($1, $2)", std::string(notify_channel), payload);
}

// Appends an event at the conversation's next seq. The caller holds the
// conversation row lock, so commit order equals seq order.
struct Appended { std::int64_t seq; std::string mid; std::int64_t ts; std::int64_t epoch; };

Appended append_event(pqxx::transaction_base& tx, const std::string& conv, const std::string& kind,
                      const std::optional<std::string>& sender, const std::optional<std::string>& cmid,
                      const std::optional<std::string>& body, std::optional<std::int64_t> target,
                      const std::optional<std::string>& subject, const std::string& fingerprint_sql,
                      const std::string& fp_arg, bool notify_in_tx) {
    // One statement, one round trip: take the seq (bump next_seq), insert the
    // row with its running counts for `unread`, and (for the admin CLI, which
    // has no bus of its own) queue the notification. Gateways publish after
    // COMMIT instead (bus.hpp).
    // $4 is reserved for the fingerprint's argument.
    std::string fp = fingerprint_sql.empty() ? std::string("(CASE WHEN $4::text IS NULL THEN NULL END)::bytea")
                                             : fingerprint_sql;
    std::string sql =
        "WITH c AS (UPDATE conversations SET next_seq = next_seq + 1, "
        "           msg_count = msg_count + CASE WHEN $3 = 'msg' THEN 1 ELSE 0 END "
        "           WHERE conv_id = $1 RETURNING next_seq - 1 AS seq, msg_count, epoch), "
        "e AS (INSERT INTO events (conv_id, seq, kind, sender_user, client_msg_id, request_hash, body, target_seq, "
        "      subject_user, epoch, msg_ordinal, sender_ordinal) "
        "      SELECT $1, c.seq, $3, NULLIF($5, ''), NULLIF($6, ''), " + fp +
        ",      CASE WHEN $7 THEN $8 END, NULLIF($9, '')::bigint, NULLIF($10, ''), c.epoch, c.msg_count, "
        "      CASE WHEN $3 = 'msg' THEN COALESCE((SELECT p.sender_ordinal FROM events p WHERE p.conv_id = $1 "
        "           AND p.sender_user = $5 AND p.kind = 'msg' ORDER BY p.seq DESC LIMIT 1), 0) + 1 END "
        "      FROM c RETURNING seq, mid::text AS mid, " + ts_ms + " AS ts, epoch) "
        "SELECT seq, mid, ts, epoch, CASE WHEN $11 THEN pg_notify($2, 'e ' || $1 || ' ' || seq) END FROM e";
    auto r = tx.exec_params(sql, conv, std::string(notify_channel), kind, fp_arg, sender.value_or(""),
                            cmid.value_or(""), body.has_value(), body.value_or(""),
                            target ? std::to_string(*target) : "", subject.value_or(""), notify_in_tx);
    if (r.empty()) throw std::runtime_error("append: conversation row vanished: " + conv);
    return {r[0][0].as<std::int64_t>(), r[0][1].c_str(), r[0][2].as<std::int64_t>(), r[0][3].as<std::int64_t>()};
}

// ---- unread -------------------------------------------------------------
// unread = msg events from others in (read, head] the user may read and that
// are not recalled. Computed from running ordinals with index lookups, so the
// cost does not grow with the length of the unread range.

// Count of msg events in the conversation with seq <= x (among the events
// still stored; purged ones never count).
std::int64_t msgs_upto(pqxx::transaction_base& tx, const std::string& conv, std::int64_t x) {
    auto r = tx.exec_params("SELECT msg_ordinal FROM events WHERE conv_id = $1 AND seq <= $2 "
                            "ORDER BY seq DESC LIMIT 1",
                            conv, x);
    if (!r.empty()) return r[0][0].as<std::int64_t>();
    // Nothing stored at or below x: count as the base just before the first stored event.
    auto f = tx.exec_params("SELECT msg_ordinal - (kind = 'msg')::int FROM events WHERE conv_id = $1 "
                            "ORDER BY seq LIMIT 1",
                            conv);
    return f.empty() ? 0 : f[0][0].as<std::int64_t>();
}

std::int64_t own_upto(pqxx::transaction_base& tx, const std::string& conv, const std::string& user, std::int64_t x) {
    auto r = tx.exec_params("SELECT sender_ordinal FROM events WHERE conv_id = $1 AND sender_user = $2 "
                            "AND kind = 'msg' AND seq <= $3 ORDER BY seq DESC LIMIT 1",
                            conv, user, x);
    if (!r.empty()) return r[0][0].as<std::int64_t>();
    auto f = tx.exec_params("SELECT sender_ordinal - 1 FROM events WHERE conv_id = $1 AND sender_user = $2 "
                            "AND kind = 'msg' ORDER BY seq LIMIT 1",
                            conv, user);
    return f.empty() ? 0 : f[0][0].as<std::int64_t>();
}

std::int64_t unread_in(pqxx::transaction_base& tx, const std::string& conv, const std::string& user,
                       const Access& access, std::int64_t read, std::int64_t head, std::int64_t min_seq) {
    std::int64_t total = 0;
    for (const auto& p : access.periods) {
        // (a, b]: the part of (read, head] inside this period, above the purge line.
        std::int64_t a = std::max(read, std::max(p.from - 1, min_seq - 1));
        std::int64_t b = std::min(head, p.to);
        if (b <= a) continue;
        std::int64_t all = msgs_upto(tx, conv, b) - msgs_upto(tx, conv, a);
        std::int64_t own = own_upto(tx, conv, user, b) - own_upto(tx, conv, user, a);
        auto rec = tx.exec_params("SELECT count(*) FROM events r JOIN events m "
                                  "ON m.conv_id = r.conv_id AND m.seq = r.target_seq "
                                  "WHERE r.conv_id = $1 AND r.kind = 'recall' AND r.target_seq > $2 "
                                  "AND r.target_seq <= $3 AND m.sender_user <> $4",
                                  conv, a, b, user);
        total += all - own - rec[0][0].as<std::int64_t>();
    }
    return std::max<std::int64_t>(total, 0);
}

// The caller's device row, held (FOR SHARE) until the transaction ends, as
// im_send does for sends (schema/functions/im_send.sql): a revocation or a new token
// waits for this transaction, and one that committed first leaves no row
// here. Its current install, or nothing when the device lost its access.
std::optional<std::string> hold_device(pqxx::transaction_base& tx, const Identity& who) {
    static const std::string sql =
        "SELECT coalesce(d.current_install, '') FROM devices d WHERE " + device_valid_where(1, 2, 3) + " FOR SHARE";
    auto r = tx.exec_params(sql, who.device, who.user, who.token_sha256);
    if (r.empty()) return std::nullopt;
    return std::string(r[0][0].c_str());
}

// Device tokens never leave the process: PostgreSQL sees (and logs, and
// shows in pg_stat_activity) only their SHA-256, as hex.
std::string token_hash_hex(const std::string& token) { return sha256_hex(token); }

std::string random_token(); // 32 random bytes as hex (admin commands below)

Error stale_install() { return {Code::stale_install, "a newer install of this device exists"}; }

} // namespace

// ---------------------------------------------------------------- hello

namespace {

// The install rule of section 4 for a device proved at hello (its row held
// FOR UPDATE by the caller): a new install supersedes the older ones; a
// superseded one is STALE_INSTALL.
std::optional<Error> register_install(pqxx::transaction_base& tx, FaultRegistry& faults, const Identity& who) {
    auto i = tx.exec_params("SELECT superseded_at IS NOT NULL FROM device_installs "
                            "WHERE device_id = $1 AND install_id = $2",
                            who.device, who.install);
    if (!i.empty()) {
        if (i[0][0].as<bool>() && !faults.broken("rule.stale_install")) return stale_install();
        return std::nullopt;
    }
    // A new install supersedes every older one of this device.
    tx.exec_params("UPDATE device_installs SET superseded_at = now() "
                   "WHERE device_id = $1 AND superseded_at IS NULL",
                   who.device);
    tx.exec_params("INSERT INTO device_installs (device_id, install_id) VALUES ($1, $2)", who.device, who.install);
    tx.exec_params("UPDATE devices SET current_install = $2 WHERE device_id = $1", who.device, who.install);
    return std::nullopt;
}

// Whether the device found by `where` ($1) already knows install $2 (read
// without a lock; the caller then locks and judges under the lock).
bool known_install(pqxx::transaction_base& tx, const std::string& where, const std::string& key,
                   const std::string& install) {
    return !tx.exec_params("SELECT 1 FROM devices d JOIN device_installs i ON i.device_id = d.device_id "
                           "WHERE d." + where + " AND i.install_id = $2",
                           key, install)
                .empty();
}

} // namespace

Outcome<Identity> Store::hello(pqxx::connection_base& c, const req::Hello& h) {
    return guarded<Identity>("hello", [&]() -> Outcome<Identity> {
        pqxx::work tx(c);
        const std::string hash = token_hash_hex(h.token);
        // The device's row is held FOR UPDATE only when this hello writes a
        // new install; a known install holds it FOR SHARE, like a send, so a
        // reconnect never waits for (nor holds up) the device's requests.
        const char* lock = known_install(tx, "token_sha256 = decode($1, 'hex')", hash, h.install) ? "FOR SHARE"
                                                                                                 : "FOR UPDATE";
        auto d = tx.exec_params(std::string("SELECT device_id, user_id FROM devices "
                                            "WHERE token_sha256 = decode($1, 'hex') AND revoked_at IS NULL ") +
                                    lock,
                                hash);
        if (d.empty()) return Error{Code::unauthenticated, "unknown or revoked device token"};
        Identity who{d[0][1].c_str(), d[0][0].c_str(), h.install, hash};
        if (auto e = register_install(tx, faults_, who)) return *e;
        tx.commit();
        return who;
    });
}

Outcome<Identity> Store::hello_jwt(pqxx::connection_base& c, const std::string& user, const std::string& device,
                                   const std::string& install, std::int64_t exp_ms) {
    return guarded<Identity>("hello", [&]() -> Outcome<Identity> {
        // The backend API's hidden per-user devices are nobody's to sign in as.
        if (std::string_view(device).starts_with(backend_device_prefix))
            return Error{Code::unauthenticated, "reserved device id"};
        pqxx::work tx(c);
        if (tx.exec_params("SELECT 1 FROM users WHERE user_id = $1", user).empty())
            return Error{Code::unauthenticated, "unknown user"};
        // The first valid hello creates the device; its token hash is of a
        // random secret nobody holds (only `device token` hands one out).
        tx.exec_params("INSERT INTO devices (device_id, user_id, token_sha256) "
                       "VALUES ($1, $2, decode($3, 'hex')) ON CONFLICT (device_id) DO NOTHING",
                       device, user, token_hash_hex(random_token()));
        const char* lock = known_install(tx, "device_id = $1", device, install) ? "FOR SHARE" : "FOR UPDATE";
        auto d = tx.exec_params(std::string("SELECT user_id, revoked_at IS NOT NULL, encode(token_sha256, 'hex') "
                                            "FROM devices WHERE device_id = $1 ") +
                                    lock,
                                device);
        if (d.empty() || d[0][0].c_str() != user) return Error{Code::unauthenticated, "device belongs to another user"};
        if (d[0][1].as<bool>()) return device_revoked();
        Identity who{user, device, install, d[0][2].c_str(), exp_ms};
        if (auto e = register_install(tx, faults_, who)) return *e;
        tx.commit();
        return who;
    });
}

// ---------------------------------------------------------------- send

Outcome<Store::SendResult> Store::send(pqxx::connection_base& c, const Identity& who, const req::Send& s) {
    auto r = send_batch(c, who, {s});
    if (r.empty()) return unavailable("conversation busy, retry with the same request");
    return r.front();
}

namespace {

// Every query of `send`: steps 0-5 of contract section 6 run inside the
// server-side function im_send (schema/functions/im_send.sql), one round
// trip per send or per pipelined run of sends to one conversation. It first
// holds the sending device's row (with the conversation's): a revoked device
// writes nothing. The lab calls its broken variants (lab_schema.hpp) the
// same way; each call's statement is prepared under the function's name.
std::string send_sql(const std::string& function) {
    return "SELECT r_item, r_code, r_seq, r_mid, r_epoch, r_dup, r_ts FROM " + function +
           "($1, $2, $3, $4, $5::text[], $6::text[], $7::text[])";
}

// im_send's answer for a run whose conversation row another transaction
// holds: nothing was written, the caller runs it again later.
constexpr std::string_view held_code = "LOCKED";

bool held(const pqxx::result& rows, int at) {
    return !rows.empty() && std::string_view(rows[0][at].c_str()) == held_code;
}

// One result row of im_send as the send's outcome; `at` is the column of
// r_code (r_seq, r_mid, r_epoch, r_dup, r_ts follow it).
Outcome<Store::SendResult> send_outcome(const std::string& conv_id, const pqxx::row& row, int at) {
    const std::string_view code = row[at].c_str();
    if (code == "NOT_MEMBER") return not_member();
    if (code == "IDEMPOTENCY_MISMATCH") return Error{Code::idempotency_mismatch, "cmid already used with different content"};
    if (code == "ORIGINAL_EXPIRED") return Error{Code::original_expired, "the original was purged by retention"};
    if (code == "PREV_NOT_COMMITTED") return unavailable("the message named by 'prev' is not committed; send it first");
    if (code == "NO_SUCH_CONV") return Error{Code::not_member, "no such conversation"}; // lab: rule.same_error armed
    if (code == "UNAUTHENTICATED") return device_revoked();
    if (code != "OK") throw std::runtime_error("im_send: unknown result code " + std::string(code));
    return Store::SendResult{Sent{conv_id, row[at + 1].as<std::int64_t>(), row[at + 2].c_str(), row[at + 4].as<bool>(),
                                  row[at + 3].as<std::int64_t>()},
                             false, row[at + 5].as<std::int64_t>()};
}

// One field of each send as a text[] literal (an empty `prev` is NULL).
std::string send_field_array(std::vector<req::Send>::const_iterator from, std::vector<req::Send>::const_iterator to,
                             std::string req::Send::*field) {
    return text_array_of(static_cast<std::size_t>(to - from), [&](std::size_t i) {
        const std::string& v = (*(from + static_cast<std::ptrdiff_t>(i))).*field;
        return field == &req::Send::prev && v.empty() ? nullptr : &v;
    });
}

} // namespace

std::vector<Outcome<Store::SendResult>> Store::send_batch(pqxx::connection_base& c, const Identity& who,
                                                          const std::vector<req::Send>& batch) {
    using Results = std::vector<Outcome<SendResult>>;
    const std::string& conv_id = batch.front().conv;
    // Lab fault points (no-ops unless --enable-faults): before the insert of
    // an item, and between the inserts and COMMIT.
    std::size_t run = batch.size();
    std::vector<bool> drop(batch.size(), false);
    if (faults_.enabled()) {
        for (std::size_t i = 0; i < batch.size(); ++i) {
            auto fi = faults_.hit("store.before_insert");
            if (fi == FaultKind::unavailable) {
                run = i; // keep the sender's order: nothing from the failed item on
                break;
            }
            drop[i] = fi == FaultKind::drop_reply;
        }
    }
    Results out;
    out.reserve(batch.size());
    bool was_held = false; // a call found the conversation's row held: the run goes back whole
    // Items [from, to) in one call; a deterministic failure of a run of
    // several is retried item by item, so it fails only its own request.
    std::function<void(std::size_t, std::size_t)> call = [&](std::size_t from, std::size_t to) {
        if (from >= to) return;
        for (int attempt = 0;; ++attempt) {
            try {
                auto r = guarded<Results, true>("send", [&]() -> Outcome<Results> {
                    const std::string fn =
                        faults_.enabled() ? lab_send_function(faults_, lab_.no_unique_index) : "im_send";
                    c.prepare(fn, send_sql(fn));
                    const auto first = batch.begin() + static_cast<std::ptrdiff_t>(from),
                               last = batch.begin() + static_cast<std::ptrdiff_t>(to);
                    const std::string cmids = send_field_array(first, last, &req::Send::cmid),
                                      bodies = send_field_array(first, last, &req::Send::body),
                                      prevs = send_field_array(first, last, &req::Send::prev);
                    pqxx::result rows;
                    if (faults_.enabled()) {
                        pqxx::work tx(c);
                        rows = tx.exec_prepared(fn, who.device, who.token_sha256, conv_id, who.user, cmids, bodies,
                                                prevs);
                        auto fc = faults_.hit("store.before_commit");
                        if (fc == FaultKind::unavailable) return Results(to - from, unavailable("injected fault"));
                        tx.commit();
                        if (fc == FaultKind::drop_reply)
                            for (std::size_t i = from; i < to; ++i) drop[i] = true;
                    } else {
                        pqxx::nontransaction tx(c); // autocommit: the call is the transaction
                        rows = tx.exec_prepared(fn, who.device, who.token_sha256, conv_id, who.user, cmids, bodies,
                                                prevs);
                    }
                    if (held(rows, 1)) {
                        was_held = true;
                        return Results(to - from, unavailable());
                    }
                    Results part;
                    for (const auto& row : rows) part.push_back(send_outcome(conv_id, row, 1));
                    if (part.size() != to - from) throw std::runtime_error("im_send: wrong number of results");
                    return part;
                });
                if (r) {
                    for (auto& o : r.value()) out.push_back(std::move(o));
                } else {
                    for (std::size_t i = from; i < to; ++i) out.push_back(r.error());
                }
                return;
            } catch (const pqxx::unique_violation&) {
                // Not reachable while the row lock is held; if it ever is, the
                // key now exists and a second pass returns it as a duplicate.
                if (attempt == 0) continue;
                for (std::size_t i = from; i < to; ++i) out.push_back(unavailable());
                return;
            } catch (const pqxx::sql_error& e) {
                // guarded<..., true> lets sql errors of the deterministic kind through.
                if (to - from > 1) {
                    for (std::size_t i = from; i < to; ++i) call(i, i + 1);
                    return;
                }
                log_warn("send_rejected", {{"conv", conv_id}, {"sqlstate", e.sqlstate()}, {"err", e.what()}});
                out.push_back(invalid("the database rejected this message (" + e.sqlstate() + ")"));
                return;
            }
        }
    };
    call(0, run);
    if (was_held) return {};
    for (std::size_t i = run; i < batch.size(); ++i) out.push_back(unavailable("injected fault"));
    for (std::size_t i = 0; i < out.size(); ++i)
        if (out[i] && drop[i]) out[i]->drop_reply = true;
    return out;
}

std::vector<std::vector<Outcome<Store::SendResult>>> Store::send_runs(pqxx::connection_base& c,
                                                                      const std::vector<SendRun>& runs) {
    using Results = std::vector<Outcome<SendResult>>;
    std::vector<Results> out(runs.size());
    auto one_by_one = [&] {
        for (std::size_t g = 0; g < runs.size(); ++g) out[g] = send_batch(c, *runs[g].who, *runs[g].sends);
        return out;
    };
    if (runs.size() == 1 || faults_.enabled()) return one_by_one();
    // Row locks in conversation order: two group statements never wait on
    // each other in a cycle (a lone send locks one row only).
    std::vector<std::size_t> order(runs.size());
    for (std::size_t g = 0; g < order.size(); ++g) order[g] = g;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return runs[a].sends->front().conv < runs[b].sends->front().conv;
    });
    const std::string name = "im_send_group_" + std::to_string(runs.size());
    std::string sql;
    constexpr std::size_t per_run = 7; // device, token hash, conv, user, cmids, bodies, prevs
    auto arg = [](std::size_t n) { return "$" + std::to_string(n); };
    for (std::size_t k = 0; k < order.size(); ++k) {
        const std::size_t p = k * per_run;
        if (k) sql += " UNION ALL ";
        sql += "SELECT " + std::to_string(k) + " AS g, r_item, r_code, r_seq, r_mid, r_epoch, r_dup, r_ts FROM im_send(" +
               arg(p + 1) + ", " + arg(p + 2) + ", " + arg(p + 3) + ", " + arg(p + 4) + ", " + arg(p + 5) +
               "::text[], " + arg(p + 6) + "::text[], " + arg(p + 7) + "::text[])";
    }
    sql += " ORDER BY g, r_item";
    pqxx::result rows;
    try {
        c.prepare(name, sql);
        std::vector<std::string> params;
        for (std::size_t k : order) {
            const auto& run = *runs[k].sends;
            params.insert(params.end(), {runs[k].who->device, runs[k].who->token_sha256, run.front().conv,
                                         runs[k].who->user,
                                         send_field_array(run.begin(), run.end(), &req::Send::cmid),
                                         send_field_array(run.begin(), run.end(), &req::Send::body),
                                         send_field_array(run.begin(), run.end(), &req::Send::prev)});
        }
        pqxx::nontransaction tx(c); // autocommit: the statement is the transaction
        rows = tx.exec_prepared(name, pqxx::prepare::make_dynamic_params(params));
    } catch (const pqxx::unique_violation&) {
        return one_by_one(); // as send_batch: its second pass answers the key as a duplicate
    } catch (const pqxx::sql_error& e) {
        if (!deterministic(e)) {
            log_warn("db_error", {{"op", "send_group"}, {"sqlstate", e.sqlstate()}, {"err", e.what()}});
            for (std::size_t g = 0; g < runs.size(); ++g) out[g] = Results(runs[g].sends->size(), unavailable());
            return out;
        }
        return one_by_one(); // nothing committed: each run alone, each item alone within it
    } catch (const pqxx::in_doubt_error& e) {
        log_warn("db_in_doubt", {{"op", "send_group"}, {"err", e.what()}});
        for (std::size_t g = 0; g < runs.size(); ++g)
            out[g] = Results(runs[g].sends->size(), unavailable("commit outcome unknown; retry with the same request"));
        return out;
    } catch (const std::exception& e) {
        log_warn("db_error", {{"op", "send_group"}, {"err", e.what()}});
        for (std::size_t g = 0; g < runs.size(); ++g) out[g] = Results(runs[g].sends->size(), unavailable());
        return out;
    }
    std::vector<bool> was_held(runs.size(), false); // its conversation's row was held: nothing written
    try {
        for (const auto& row : rows) {
            const std::size_t g = order.at(static_cast<std::size_t>(row[0].as<int>()));
            const std::string& conv_id = runs[g].sends->front().conv;
            if (std::string_view(row[2].c_str()) == held_code) was_held[g] = true;
            else out[g].push_back(send_outcome(conv_id, row, 2));
        }
    } catch (const std::exception& e) { // committed, but unreadable: the resends are dups
        log_warn("db_error", {{"op", "send_group_result"}, {"err", e.what()}});
        for (auto& o : out) o.clear();
    }
    for (std::size_t g = 0; g < runs.size(); ++g) {
        if (was_held[g]) out[g].clear(); // run it again later (Store::send_runs, header)
        else if (out[g].size() != runs[g].sends->size()) // committed, but the answer is unreadable: the resend is a dup
            out[g] = Results(runs[g].sends->size(), unavailable());
    }
    return out;
}

// ---------------------------------------------------------------- sync / history

namespace {

// Collects the readable events of one direction, period by period: each
// query is one range scan of the primary key (conv_id, seq) inside a period,
// so ranges the caller may not read (a left-and-rejoined member's gap) are
// never scanned. Stops at `want` events or when the next one would pass the
// frame budget (never before the first).
struct Collector {
    std::int64_t want;
    std::vector<Event> events;
    std::size_t bytes = 0;
    bool cut = false; // stopped early: readable events remain past the last one
    bool raced = false; // a range had a hole: a purge ran between the statements

    // Seqs in [lo, hi] are gap-free (purges only remove below min_seq), so a
    // range read in its own statement must come back whole: first..last
    // consecutive, as many rows as asked or the whole range.
    bool whole(const pqxx::result& r, std::int64_t lo, std::int64_t hi, std::int64_t limit, bool newest_first) {
        std::int64_t expect = newest_first ? hi : lo;
        for (const auto& row : r) {
            if (row[1].as<std::int64_t>() != expect) return false;
            expect += newest_first ? -1 : 1;
        }
        return static_cast<std::int64_t>(r.size()) == std::min(limit, hi - lo + 1);
    }

    // Adds the rows in order; false once the page is full.
    bool take(const pqxx::result& r) {
        for (const auto& row : r) {
            if (static_cast<std::int64_t>(events.size()) >= want) {
                cut = true;
                return false;
            }
            Event ev = read_event(row);
            std::size_t n = encoded_size(ev);
            if (!events.empty() && bytes + n > page_item_budget) {
                cut = true;
                return false;
            }
            bytes += n;
            events.push_back(std::move(ev));
        }
        return true;
    }
};

} // namespace

std::string Store::event_range_sql(bool newest_first) {
    return "SELECT " + event_columns() + " FROM events WHERE conv_id = $1 AND seq >= $2 AND seq <= $3 ORDER BY seq" +
           (newest_first ? " DESC" : "") + " LIMIT $4";
}

// Read requests run as autocommit statements (no BEGIN/COMMIT round trips).
// The first reads the conversation row and the caller's periods; every
// event up to the head it saw is committed (commit order = seq order under
// the row lock), so later statements see them all, unless a purge removed
// some in between: then the reply is read again inside one snapshot.
template <class T, class Read>
Outcome<T> read_request(pqxx::connection_base& c, Read read) {
    bool raced = false;
    {
        pqxx::nontransaction tx(c);
        auto o = read(tx, raced);
        if (!raced) return o;
    }
    pqxx::transaction<pqxx::repeatable_read, pqxx::read_only> tx(c);
    return read(tx, raced);
}

Outcome<Page> Store::sync(pqxx::connection_base& c, const Identity& who, const req::Sync& s) {
    return guarded<Page>("sync", [&]() -> Outcome<Page> {
      return read_request<Page>(c, [&](pqxx::transaction_base& tx, bool& raced) -> Outcome<Page> {
        auto loaded = load_conv_access(tx, s.conv, who);
        if (!loaded) return loaded.error();
        auto& [conv_row, access] = loaded.value();
        const ConvRow* conv = &conv_row;
        if (!access.any()) return not_member();
        if (faults_.broken("rule.membership_periods")) { // lab negative control only
            for (auto& per : access.periods) per.to = INT64_MAX;
            access.head = conv->next_seq - 1;
        }
        if (s.epoch && *s.epoch != conv->epoch && !faults_.broken("rule.epoch"))
            return Error{Code::epoch_changed, "epoch is now " + std::to_string(conv->epoch)};
        if (s.after > access.head && !faults_.broken("rule.cursor_ahead"))
            return Error{Code::cursor_ahead, "after is beyond head"};

        Page p;
        p.conv = s.conv;
        p.head = access.head;
        p.min_seq = conv->min_seq;
        p.epoch = conv->epoch;
        p.trimmed = s.after < conv->min_seq - 1;
        Collector col{s.limit, {}, 0, false};
        for (const auto& per : access.periods) { // ascending from_seq
            std::int64_t lo = std::max({s.after + 1, per.from, conv->min_seq});
            std::int64_t hi = std::min(per.to, access.head);
            if (lo > hi) continue;
            // One row more than still fits tells whether more remain.
            const std::int64_t limit = col.want - static_cast<std::int64_t>(col.events.size()) + 1;
            auto r = tx.exec_params(event_range_sql(false), s.conv, lo, hi, limit);
            if (!col.whole(r, lo, hi, limit, false)) {
                raced = true;
                return Error{Code::unavailable, "purged while read"};
            }
            if (!col.take(r)) break;
        }
        p.events = std::move(col.events);
        p.has_more = col.cut;
        p.next_after = p.has_more ? p.events.back().seq : access.head;
        if (faults_.broken("rule.page_cursor")) { // lab negative control only: the cursor is "the head now"
            auto h = tx.exec_params("SELECT next_seq - 1 FROM conversations WHERE conv_id = $1", s.conv);
            p.next_after = h[0][0].as<std::int64_t>();
        }
        return p;
      });
    });
}

Outcome<HistoryPage> Store::history(pqxx::connection_base& c, const Identity& who, const req::History& h) {
    return guarded<HistoryPage>("history", [&]() -> Outcome<HistoryPage> {
      return read_request<HistoryPage>(c, [&](pqxx::transaction_base& tx, bool& raced) -> Outcome<HistoryPage> {
        auto loaded = load_conv_access(tx, h.conv, who);
        if (!loaded) return loaded.error();
        auto& [conv_row, access] = loaded.value();
        const ConvRow* conv = &conv_row;
        if (!access.any()) return not_member();
        if (h.epoch && *h.epoch != conv->epoch)
            return Error{Code::epoch_changed, "epoch is now " + std::to_string(conv->epoch)};
        if (h.before > access.head + 1) return Error{Code::cursor_ahead, "before is beyond head + 1"};
        const std::int64_t before = h.before == 0 ? access.head + 1 : h.before;

        HistoryPage p;
        p.conv = h.conv;
        p.head = access.head;
        p.min_seq = conv->min_seq;
        p.epoch = conv->epoch;
        // The lowest seq the caller could ever read here (purged ones aside).
        const std::int64_t floor_seq = std::max(conv->min_seq, access.periods.front().from);
        Collector col{h.limit, {}, 0, false};
        for (auto it = access.periods.rbegin(); it != access.periods.rend(); ++it) { // newest period first
            std::int64_t lo = std::max(it->from, conv->min_seq);
            std::int64_t hi = std::min({it->to, access.head, before - 1});
            if (lo > hi) continue;
            const std::int64_t limit = col.want - static_cast<std::int64_t>(col.events.size()) + 1;
            auto r = tx.exec_params(event_range_sql(true), h.conv, lo, hi, limit);
            if (!col.whole(r, lo, hi, limit, true)) {
                raced = true;
                return Error{Code::unavailable, "purged while read"};
            }
            if (!col.take(r)) break;
        }
        std::reverse(col.events.begin(), col.events.end());
        p.events = std::move(col.events);
        p.has_older = col.cut;
        p.oldest = p.has_older ? p.events.front().seq : std::min(before, floor_seq);
        // Purged events the caller could have read lie below this window.
        p.trimmed = !p.has_older && conv->min_seq > access.periods.front().from;
        return p;
      });
    });
}

// ---------------------------------------------------------------- fetch

Outcome<Fetched> Store::fetch(pqxx::connection_base& c, const Identity& who, const req::Fetch& f) {
    return guarded<Fetched>("fetch", [&]() -> Outcome<Fetched> {
        // Two autocommit statements: the event is committed if seq <= head;
        // a purge in between makes it NOT_FOUND, as it would be a moment later.
        pqxx::nontransaction tx(c);
        auto loaded = load_conv_access(tx, f.conv, who);
        if (!loaded) return loaded.error();
        auto& access = loaded->second;
        if (!access.any()) return not_member();
        if (f.seq > access.head) return Error{Code::not_found, "no such event"};
        if (!access.can_read(f.seq)) return not_member();
        auto r = tx.exec_params("SELECT " + event_columns() + " FROM events WHERE conv_id = $1 AND seq = $2",
                                f.conv, f.seq);
        if (r.empty()) return Error{Code::not_found, "no such event"};
        return Fetched{read_event(r[0])};
    });
}

// ---------------------------------------------------------------- convs

Outcome<ConvList> Store::convs(pqxx::connection_base& c, const Identity& who, const req::Convs& q) {
    return guarded<ConvList>("convs", [&]() -> Outcome<ConvList> {
        pqxx::transaction<pqxx::repeatable_read, pqxx::read_only> tx(c);
        static const std::string device_ok = "SELECT " + device_valid_sql(1, 2, 3);
        if (who.backend) {
            if (tx.exec_params("SELECT 1 FROM users WHERE user_id = $1", who.user).empty())
                return Error{Code::not_found, "no such user"};
        } else if (!tx.exec_params(device_ok, who.device, who.user, who.token_sha256)[0][0].as<bool>())
            return device_revoked();
        // The backend API's user-level view: `delivered` is the furthest any
        // of the user's devices acknowledged (docs/integration.md).
        static const std::string delivered_of_user =
            "COALESCE((SELECT max(dm.delivered) FROM delivery_markers dm JOIN devices dv ON dv.device_id = dm.device_id "
            "WHERE dm.conv_id = c.conv_id AND dv.user_id = $1), 0)";
        // The user's conversations in conv_id order after `after`: a range
        // scan of membership_by_user (user_id, conv_id), one row more than
        // asked tells whether more remain.
        auto r = tx.exec_params(
            "SELECT c.conv_id, c.kind, c.next_seq, c.epoch, c.min_seq, " +
            (who.backend ? delivered_of_user : std::string("COALESCE(dm.delivered, 0)")) + ", COALESCE(rm.read, 0) "
            "FROM (SELECT DISTINCT conv_id FROM membership_periods WHERE user_id = $1 AND conv_id > $3 "
            "      ORDER BY conv_id LIMIT $4) m "
            "JOIN conversations c ON c.conv_id = m.conv_id "
            "LEFT JOIN delivery_markers dm ON dm.conv_id = c.conv_id AND dm.device_id = $2 "
            "LEFT JOIN read_markers rm ON rm.conv_id = c.conv_id AND rm.user_id = $1 "
            "ORDER BY c.conv_id",
            who.user, who.device, q.after, q.limit + 1);
        ConvList out;
        std::size_t bytes = 0;
        for (const auto& row : r) {
            if (static_cast<std::int64_t>(out.convs.size()) >= q.limit) {
                out.has_more = true;
                break;
            }
            Watchdog::progress(); // each entry takes a few round trips
            ConvInfo ci;
            ci.conv = row[0].c_str();
            ci.kind = row[1].c_str();
            auto access = load_access(tx, ci.conv, who.user, row[2].as<std::int64_t>());
            ci.head = access.head;
            ci.epoch = row[3].as<std::int64_t>();
            ci.min_seq = row[4].as<std::int64_t>();
            ci.delivered = row[5].as<std::int64_t>();
            ci.read = row[6].as<std::int64_t>();
            ci.unread = unread_in(tx, ci.conv, who.user, access, ci.read, ci.head, ci.min_seq);
            std::size_t n = encoded_size(ci);
            if (!out.convs.empty() && bytes + n > page_item_budget) {
                out.has_more = true;
                break;
            }
            bytes += n;
            out.convs.push_back(std::move(ci));
        }
        out.next_after = out.convs.empty() ? q.after : out.convs.back().conv;
        return out;
    });
}

// ---------------------------------------------------------------- ack / read

Outcome<Acked> Store::ack(pqxx::connection_base& c, const Identity& who, const req::Ack& a) {
    return guarded<Acked>("ack", [&]() -> Outcome<Acked> {
        pqxx::work tx(c);
        const auto install = hold_device(tx, who);
        if (!install) return device_revoked();
        if (*install != who.install && !faults_.broken("rule.stale_install")) return stale_install();
        auto conv = load_conv(tx, a.conv, false);
        if (!conv) return not_member();
        auto access = load_access(tx, a.conv, who.user, conv->next_seq);
        if (!access.any()) return not_member();
        if (a.seq > access.head) return Error{Code::cursor_ahead, "seq is beyond head"};
        auto r = tx.exec_params("INSERT INTO delivery_markers (conv_id, device_id, delivered) VALUES ($1, $2, $3) "
                                "ON CONFLICT (conv_id, device_id) DO UPDATE "
                                "SET delivered = GREATEST(delivery_markers.delivered, EXCLUDED.delivered) "
                                "RETURNING delivered",
                                a.conv, who.device, a.seq);
        if (faults_.hit("store.ack_before_commit") == FaultKind::unavailable) return unavailable("injected fault");
        tx.commit();
        return Acked{a.conv, r[0][0].as<std::int64_t>()};
    });
}

Outcome<ReadOk> Store::read(pqxx::connection_base& c, const Identity& who, const req::Read& rd, Notes& notes) {
    return guarded<ReadOk>("read", [&]() -> Outcome<ReadOk> {
        pqxx::work tx(c);
        const auto install = hold_device(tx, who);
        if (!install) return device_revoked();
        if (*install != who.install && !faults_.broken("rule.stale_install")) return stale_install();
        auto conv = load_conv(tx, rd.conv, false);
        if (!conv) return not_member();
        auto access = load_access(tx, rd.conv, who.user, conv->next_seq);
        if (!access.any()) return not_member();
        if (rd.seq > access.head) return Error{Code::cursor_ahead, "seq is beyond head"};
        auto old = tx.exec_params("SELECT read FROM read_markers WHERE conv_id = $1 AND user_id = $2 FOR UPDATE",
                                  rd.conv, who.user);
        std::int64_t before = old.empty() ? 0 : old[0][0].as<std::int64_t>();
        auto r = tx.exec_params("INSERT INTO read_markers (conv_id, user_id, read) VALUES ($1, $2, $3) "
                                "ON CONFLICT (conv_id, user_id) DO UPDATE "
                                "SET read = GREATEST(read_markers.read, EXCLUDED.read) RETURNING read",
                                rd.conv, who.user, rd.seq);
        std::int64_t now = r[0][0].as<std::int64_t>();
        if (faults_.hit("store.read_before_commit") == FaultKind::unavailable) return unavailable("injected fault");
        tx.commit();
        // The user's other devices learn of it through the gateways.
        if (now > before && !faults_.broken("rule.read_hint")) notes.push_back("r " + rd.conv + " " + who.user + " " + who.device + " " + std::to_string(now));
        return ReadOk{rd.conv, now};
    });
}

// ---------------------------------------------------------------- recall

Outcome<Recalled> Store::recall(pqxx::connection_base& c, const Identity& who, const req::Recall& rc) {
    return guarded<Recalled>("recall", [&]() -> Outcome<Recalled> {
        pqxx::work tx(c);
        // Without any lock first (C4): a stranger never waits on the row lock.
        if (tx.exec_params("SELECT 1 FROM membership_periods WHERE conv_id = $1 AND user_id = $2 LIMIT 1", rc.conv,
                           who.user)
                .empty())
            return not_member();
        if (!hold_device(tx, who)) return device_revoked();
        auto conv = load_conv(tx, rc.conv, true);
        if (!conv) return not_member();
        auto access = load_access(tx, rc.conv, who.user, conv->next_seq);
        if (!access.any()) return not_member(); // C4: nothing else is revealed
        const std::string target = std::to_string(rc.target);
        // The request key, as for send, with the recall fingerprint (looked up
        // through the key's index: OFFSET 0 keeps ORDER BY seq from choosing
        // a walk of the conversation by primary key, as in im_send).
        auto k = tx.exec_params(std::string("SELECT seq, request_hash = ") + recall_fp +
                                    " FROM (SELECT seq, request_hash FROM events WHERE conv_id = $1 AND sender_user = $2 "
                                    "AND client_msg_id = $3 OFFSET 0) found ORDER BY seq LIMIT 1",
                                rc.conv, who.user, rc.cmid, target);
        if (!k.empty()) {
            if (!k[0][1].as<bool>())
                return Error{Code::idempotency_mismatch, "cmid already used with different content"};
            return Recalled{rc.conv, k[0][0].as<std::int64_t>(), true};
        }
        auto t = tx.exec_params("SELECT 1 FROM idem_tombstones WHERE conv_id = $1 AND sender_user = $2 "
                                "AND client_msg_id = $3",
                                rc.conv, who.user, rc.cmid);
        if (!t.empty()) return Error{Code::original_expired, "the original was purged by retention"};
        // The target: exists and not purged; readable; a msg; ours; not recalled; in the window.
        if (rc.target > access.head || rc.target < conv->min_seq)
            return Error{Code::not_found, "no such event"};
        auto ev = tx.exec_params("SELECT kind, sender_user, "
                                 "clock_timestamp() <= created_at + $3 * interval '1 millisecond' "
                                 "FROM events WHERE conv_id = $1 AND seq = $2",
                                 rc.conv, rc.target, conv->recall_window_ms);
        if (ev.empty()) return Error{Code::not_found, "no such event"};
        if (!access.can_read(rc.target)) return not_member();
        if (std::string_view(ev[0][0].c_str()) != "msg") return invalid("only a msg event can be recalled");
        if (ev[0][1].is_null() || who.user != ev[0][1].c_str())
            return Error{Code::not_sender, "only the sender may recall"};
        auto done = tx.exec_params("SELECT 1 FROM events WHERE conv_id = $1 AND kind = 'recall' AND target_seq = $2",
                                   rc.conv, rc.target);
        if (!done.empty()) return Error{Code::already_recalled, "already recalled"};
        if (!ev[0][2].as<bool>() && !faults_.broken("rule.recall_window"))
            return Error{Code::recall_window_expired, "past the recall window"};
        if (!access.open) return not_member();
        auto a = append_event(tx, rc.conv, "recall", who.user, rc.cmid, std::nullopt, rc.target,
                              std::nullopt, recall_fp, target, false);
        if (faults_.hit("store.recall_before_commit") == FaultKind::unavailable) return unavailable("injected fault");
        tx.commit();
        return Recalled{rc.conv, a.seq, false};
    });
}

// ---------------------------------------------------------------- push side

bool Store::PushBatch::can_read(const std::string& user, std::int64_t seq) const {
    for (const auto& p : periods)
        if (p.user == user && seq >= p.from && seq <= p.to) return true;
    return false;
}

std::int64_t Store::PushBatch::head_for(const std::string& user) const {
    std::int64_t h = 0;
    for (const auto& p : periods)
        if (p.user == user) h = std::max(h, std::min(p.to, head));
    return h;
}

std::optional<Store::PushBatch> Store::load_push(pqxx::connection_base& c, const std::string& conv,
                                                 std::int64_t from, std::int64_t to) {
    pqxx::transaction<pqxx::repeatable_read, pqxx::read_only> tx(c);
    auto conv_row = load_conv(tx, conv, false);
    if (!conv_row) return std::nullopt;
    PushBatch b;
    b.head = conv_row->next_seq - 1;
    b.epoch = conv_row->epoch;
    if (from <= to) {
        auto r = tx.exec_params("SELECT " + event_columns() +
                                    " FROM events WHERE conv_id = $1 AND seq >= $2 AND seq <= $3 ORDER BY seq",
                                conv, from, to);
        for (const auto& row : r) b.events.push_back(read_event(row));
    }
    std::int64_t open = 0;
    for (const auto& row : tx.exec_params("SELECT user_id, from_seq, to_seq FROM membership_periods "
                                          "WHERE conv_id = $1",
                                          conv)) {
        PushBatch::Period p{row[0].c_str(), row[1].as<std::int64_t>(),
                            row[2].is_null() ? INT64_MAX : row[2].as<std::int64_t>()};
        if (row[2].is_null()) ++open;
        b.periods.push_back(std::move(p));
    }
    b.full = open <= conv_row->push_full_max;
    return b;
}

// The fan-out's reads: prepared once per connection, autocommit (one
// statement, one snapshot, no BEGIN/ROLLBACK round trips).
std::vector<Event> Store::push_events(pqxx::connection_base& c, const std::string& conv, std::int64_t from,
                                      std::int64_t to) {
    c.prepare("im_push_events", "SELECT " + event_columns() +
                                    " FROM events WHERE conv_id = $1 AND seq >= $2 AND seq <= $3 ORDER BY seq");
    pqxx::nontransaction tx(c);
    std::vector<Event> out;
    for (const auto& row : tx.exec_prepared("im_push_events", conv, from, to)) out.push_back(read_event(row));
    return out;
}

Store::Members Store::push_members(pqxx::connection_base& c, const std::string& conv) {
    c.prepare("im_push_members",
              "SELECT m.user_id, m.from_seq, m.to_seq, c.push_full_max FROM conversations c "
              "LEFT JOIN membership_periods m ON m.conv_id = c.conv_id WHERE c.conv_id = $1");
    pqxx::nontransaction tx(c);
    Members out;
    std::int64_t open = 0, full_max = 0;
    for (const auto& row : tx.exec_prepared("im_push_members", conv)) {
        full_max = row[3].as<std::int64_t>();
        if (row[0].is_null()) continue;
        out.periods.push_back({row[0].c_str(), row[1].as<std::int64_t>(),
                               row[2].is_null() ? INT64_MAX : row[2].as<std::int64_t>()});
        if (row[2].is_null()) ++open;
    }
    out.full = open <= full_max;
    return out;
}

Store::TokenPairs Store::stale_tokens(pqxx::connection_base& c, const TokenPairs& open) {
    std::vector<std::string> devices, hashes;
    for (const auto& [d, h] : open) {
        devices.push_back(d);
        hashes.push_back(h);
    }
    pqxx::nontransaction tx(c);
    auto r = tx.exec_params("SELECT o.dev, o.h FROM unnest($1::text[], $2::text[]) AS o(dev, h) "
                            "LEFT JOIN devices d ON d.device_id = o.dev "
                            "WHERE d.device_id IS NULL OR d.revoked_at IS NOT NULL "
                            "   OR d.token_sha256 IS DISTINCT FROM decode(o.h, 'hex')",
                            text_array(devices), text_array(hashes));
    TokenPairs stale;
    for (const auto& row : r) stale.emplace_back(row[0].c_str(), row[1].c_str());
    return stale;
}

void Store::open_publisher(pqxx::connection_base& c) {
    set_session_variable(c, "synchronous_commit", "off"); // kept on libpqxx's reconnects
    c.prepare("im_publish", "SELECT count(pg_notify($1, p)) FROM unnest($2::text[]) AS p");
}

void Store::publish(pqxx::connection_base& c, const Notes& payloads) {
    pqxx::nontransaction tx(c);
    tx.exec_prepared("im_publish", std::string(notify_channel), text_array(payloads));
}

bool Store::probe(pqxx::connection_base& c) {
    try {
        pqxx::nontransaction tx(c);
        tx.exec("SELECT 1");
        return true;
    } catch (const std::exception&) {
        return false;
    }
}

bool Store::idempotency_index_present(pqxx::connection_base& c) {
    pqxx::nontransaction tx(c);
    auto r = tx.exec("SELECT 1 FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid "
                     "WHERE x.relname = 'events_idempotency' AND i.indisunique AND i.indisvalid "
                     "AND x.relnamespace = current_schema()::regnamespace");
    return !r.empty();
}

// ---------------------------------------------------------------- admin

namespace {
std::string random_token() {
    std::ifstream rnd("/dev/urandom", std::ios::binary);
    unsigned char buf[32];
    if (!rnd.read(reinterpret_cast<char*>(buf), sizeof buf)) throw std::runtime_error("cannot read /dev/urandom");
    static const char* hex = "0123456789abcdef";
    std::string out;
    for (unsigned char b : buf) {
        out += hex[b >> 4];
        out += hex[b & 15];
    }
    return out;
}

void need_id(const std::string& what, const std::string& id) {
    if (!valid_id(id)) throw AdminError(AdminError::invalid, what + " must be 1-64 characters of [A-Za-z0-9._:-]: '" + id + "'");
}

ConvRow need_conv(pqxx::transaction_base& tx, const std::string& conv) {
    auto row = load_conv(tx, conv, true);
    if (!row) throw AdminError(AdminError::not_found, "no such conversation: " + conv);
    return *row;
}

// Operator commands announce their commits either inside the transaction
// (PostgreSQL NOTIFY: delivered exactly when it commits) or, when the CLI
// runs with another bus, into `sink`, published by the caller after COMMIT.
void admin_note(pqxx::transaction_base& tx, Notes* sink, const std::string& payload) {
    if (sink) sink->push_back(payload);
    else notify(tx, payload);
}

std::int64_t admin_append(pqxx::transaction_base& tx, Notes* sink, const std::string& conv, const std::string& kind,
                          const std::string& subject) {
    auto a = append_event(tx, conv, kind, std::nullopt, std::nullopt, std::nullopt, std::nullopt, subject, "", "",
                          sink == nullptr);
    if (sink) sink->push_back("e " + conv + " " + std::to_string(a.seq));
    return a.seq;
}

std::int64_t open_member(pqxx::transaction_base& tx, Notes* sink, const std::string& conv, const std::string& user) {
    auto seq = admin_append(tx, sink, conv, "join", user);
    tx.exec_params("INSERT INTO membership_periods (conv_id, user_id, from_seq) VALUES ($1, $2, $3)", conv, user, seq);
    return seq;
}
} // namespace

bool Store::add_user(pqxx::connection_base& c, const std::string& user) {
    need_id("user", user);
    pqxx::work tx(c);
    auto r = tx.exec_params("INSERT INTO users (user_id) VALUES ($1) ON CONFLICT DO NOTHING RETURNING 1", user);
    tx.commit();
    return !r.empty();
}

std::string Store::add_device(pqxx::connection_base& c, const std::string& user, const std::string& device) {
    need_id("device", device);
    pqxx::work tx(c);
    if (tx.exec_params("SELECT 1 FROM users WHERE user_id = $1", user).empty())
        throw AdminError(AdminError::not_found, "no such user: " + user);
    if (!tx.exec_params("SELECT 1 FROM devices WHERE device_id = $1", device).empty())
        throw AdminError(AdminError::exists, "device exists: " + device);
    std::string token = random_token();
    tx.exec_params("INSERT INTO devices (device_id, user_id, token_sha256) VALUES ($1, $2, decode($3, 'hex'))",
                   device, user, token_hash_hex(token));
    tx.commit();
    return token;
}

std::string Store::reissue_token(pqxx::connection_base& c, const std::string& device) {
    pqxx::work tx(c);
    std::string token = random_token();
    auto r = tx.exec_params("UPDATE devices SET token_sha256 = decode($2, 'hex'), revoked_at = NULL "
                            "WHERE device_id = $1 RETURNING 1",
                            device, token_hash_hex(token));
    if (r.empty()) throw AdminError(AdminError::not_found, "no such device: " + device);
    admin_note(tx, after_commit_, "d - " + device); // the old token's connections close on every gateway
    tx.commit();
    return token;
}

void Store::revoke_device(pqxx::connection_base& c, const std::string& device) {
    pqxx::work tx(c);
    auto r = tx.exec_params("UPDATE devices SET revoked_at = now() WHERE device_id = $1 RETURNING 1", device);
    if (r.empty()) throw AdminError(AdminError::not_found, "no such device: " + device);
    admin_note(tx, after_commit_, "d - " + device); // its connections close on every gateway
    tx.commit();
}

bool Store::create_conv(pqxx::connection_base& c, const std::string& conv, const std::string& kind,
                        const std::vector<std::string>& members) {
    need_id("conversation", conv);
    if (kind != "direct" && kind != "group") throw AdminError(AdminError::invalid, "kind must be direct or group");
    if (kind == "direct" && members.size() != 2) throw AdminError(AdminError::invalid, "a direct conversation has 2 members");
    pqxx::work tx(c);
    auto r = tx.exec_params("INSERT INTO conversations (conv_id, kind) VALUES ($1, $2) ON CONFLICT DO NOTHING "
                            "RETURNING 1",
                            conv, kind);
    if (r.empty()) {
        // The same conversation again (kind and current members) is fine.
        auto existing = tx.exec_params("SELECT c.kind, m.user_id FROM conversations c LEFT JOIN membership_periods m "
                                       "ON m.conv_id = c.conv_id AND m.to_seq IS NULL WHERE c.conv_id = $1 "
                                       "ORDER BY m.user_id",
                                       conv);
        std::vector<std::string> wanted = members, current;
        std::sort(wanted.begin(), wanted.end());
        for (const auto& row : existing)
            if (!row[1].is_null()) current.push_back(row[1].c_str());
        if (!existing.empty() && existing[0][0].as<std::string>() == kind && current == wanted) return false;
        throw AdminError(AdminError::exists, "conversation exists with other settings: " + conv);
    }
    for (const auto& u : members) {
        if (tx.exec_params("SELECT 1 FROM users WHERE user_id = $1", u).empty())
            throw AdminError(AdminError::not_found, "no such user: " + u);
        auto row = need_conv(tx, conv);
        if (!tx.exec_params("SELECT 1 FROM membership_periods WHERE conv_id = $1 AND user_id = $2", conv, u).empty())
            throw AdminError(AdminError::invalid, "member listed twice: " + u);
        open_member(tx, after_commit_, conv, u);
    }
    tx.commit();
    return true;
}

std::int64_t Store::add_member(pqxx::connection_base& c, const std::string& conv, const std::string& user,
                               bool* already) {
    if (already) *already = false;
    pqxx::work tx(c);
    auto row = need_conv(tx, conv);
    if (tx.exec_params("SELECT 1 FROM users WHERE user_id = $1", user).empty())
        throw AdminError(AdminError::not_found, "no such user: " + user);
    auto open = tx.exec_params("SELECT from_seq FROM membership_periods WHERE conv_id = $1 AND user_id = $2 "
                               "AND to_seq IS NULL",
                               conv, user);
    if (!open.empty()) {
        if (already) {
            *already = true;
            return open[0][0].as<std::int64_t>(); // the seq of the join that opened the period
        }
        throw AdminError(AdminError::exists, user + " is already a member of " + conv);
    }
    auto seq = open_member(tx, after_commit_, conv, user);
    tx.commit();
    return seq;
}

std::int64_t Store::remove_member(pqxx::connection_base& c, const std::string& conv, const std::string& user) {
    pqxx::work tx(c);
    auto row = need_conv(tx, conv);
    if (tx.exec_params("SELECT 1 FROM membership_periods WHERE conv_id = $1 AND user_id = $2 AND to_seq IS NULL",
                       conv, user)
            .empty())
        throw AdminError(AdminError::not_member, user + " is not a member of " + conv);
    auto seq = admin_append(tx, after_commit_, conv, "leave", user);
    tx.exec_params("UPDATE membership_periods SET to_seq = $3 WHERE conv_id = $1 AND user_id = $2 AND to_seq IS NULL",
                   conv, user, seq);
    tx.commit();
    return seq;
}

void Store::set_conv(pqxx::connection_base& c, const std::string& conv, std::optional<std::int64_t> recall_window_ms,
                     std::optional<std::int64_t> push_full_max) {
    pqxx::work tx(c);
    need_conv(tx, conv);
    if (recall_window_ms)
        tx.exec_params("UPDATE conversations SET recall_window_ms = $2 WHERE conv_id = $1", conv, *recall_window_ms);
    if (push_full_max)
        tx.exec_params("UPDATE conversations SET push_full_max = $2 WHERE conv_id = $1", conv, *push_full_max);
    admin_note(tx, after_commit_, "m " + conv); // gateways drop their cached membership of it
    tx.commit();
}

std::int64_t Store::bump_epoch(pqxx::connection_base& c, const std::string& conv) {
    pqxx::work tx(c);
    need_conv(tx, conv);
    auto r = tx.exec_params("UPDATE conversations SET epoch = epoch + 1 WHERE conv_id = $1 RETURNING epoch", conv);
    admin_note(tx, after_commit_, "x " + conv);
    tx.commit();
    return r[0][0].as<std::int64_t>();
}

std::int64_t Store::purge(pqxx::connection_base& c, const std::string& conv, std::optional<std::int64_t> before_seq,
                          std::optional<std::int64_t> older_than_ms, std::int64_t batch) {
    std::int64_t cutoff = 0;
    {
        pqxx::work tx(c);
        auto row = need_conv(tx, conv);
        if (before_seq) cutoff = std::min(*before_seq, row.next_seq);
        else {
            auto r = tx.exec_params("SELECT COALESCE(min(seq), $2) FROM events WHERE conv_id = $1 "
                                    "AND created_at > clock_timestamp() - $3 * interval '1 millisecond'",
                                    conv, row.next_seq, *older_than_ms);
            cutoff = r[0][0].as<std::int64_t>();
        }
        tx.commit();
    }
    std::int64_t purged = 0;
    for (;;) {
        // One batch, one transaction: tombstones, delete, raise min_seq together.
        pqxx::work tx(c);
        auto row = need_conv(tx, conv);
        if (row.min_seq >= cutoff) break;
        std::int64_t end = std::min(cutoff, row.min_seq + batch);
        if (!lab_.purge_without_tombstones)
            tx.exec_params("INSERT INTO idem_tombstones (conv_id, sender_user, client_msg_id, request_hash, seq) "
                           "SELECT conv_id, sender_user, client_msg_id, request_hash, seq FROM events "
                           "WHERE conv_id = $1 AND seq < $2 AND client_msg_id IS NOT NULL "
                           "ON CONFLICT DO NOTHING",
                           conv, end);
        if (faults_.hit("store.purge_after_tombstones") == FaultKind::unavailable)
            throw std::runtime_error("purge: injected fault after the tombstones");
        auto d = tx.exec_params("DELETE FROM events WHERE conv_id = $1 AND seq < $2", conv, end);
        tx.exec_params("UPDATE conversations SET min_seq = $2 WHERE conv_id = $1", conv, end);
        if (faults_.hit("store.purge_before_commit") == FaultKind::unavailable)
            throw std::runtime_error("purge: injected fault before the commit");
        tx.commit();
        purged += static_cast<std::int64_t>(d.affected_rows());
    }
    return purged;
}

std::vector<std::string> Store::all_convs(pqxx::connection_base& c) {
    pqxx::work tx(c);
    std::vector<std::string> out;
    for (const auto& row : tx.exec("SELECT conv_id FROM conversations ORDER BY conv_id")) out.push_back(row[0].c_str());
    return out;
}

bool Store::user_exists(pqxx::connection_base& c, const std::string& user) {
    pqxx::work tx(c);
    return !tx.exec_params("SELECT 1 FROM users WHERE user_id = $1", user).empty();
}

bool Store::device_exists(pqxx::connection_base& c, const std::string& device) {
    pqxx::work tx(c);
    return !tx.exec_params("SELECT 1 FROM devices WHERE device_id = $1", device).empty();
}

bool Store::token_valid(pqxx::connection_base& c, const std::string& device, const std::string& token) {
    pqxx::work tx(c);
    return !tx.exec_params("SELECT 1 FROM devices WHERE device_id = $1 AND revoked_at IS NULL "
                           "AND token_sha256 = decode($2, 'hex')",
                           device, token_hash_hex(token))
                .empty();
}

// ---------------------------------------------------------------- backend API

std::string Store::add_api_key(pqxx::connection_base& c, const std::string& name, const std::string& scope) {
    need_id("key name", name);
    if (scope != "read" && scope != "write" && scope != "admin")
        throw AdminError(AdminError::invalid, "scope must be read, write or admin");
    const std::string key_id = random_token().substr(0, 16);
    const std::string key = "imk_" + key_id + "_" + random_token();
    pqxx::work tx(c);
    auto r = tx.exec_params("INSERT INTO api_keys (name, key_id, key_sha256, scope) "
                            "VALUES ($1, $2, decode($3, 'hex'), $4) ON CONFLICT (name) DO NOTHING RETURNING 1",
                            name, key_id, token_hash_hex(key), scope);
    if (r.empty()) throw AdminError(AdminError::exists, "API key exists: " + name + " (revoke it, then add another name)");
    tx.commit();
    return key;
}

void Store::revoke_api_key(pqxx::connection_base& c, const std::string& name) {
    pqxx::work tx(c);
    auto r = tx.exec_params("UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE name = $1 RETURNING 1",
                            name);
    if (r.empty()) throw AdminError(AdminError::not_found, "no such API key: " + name);
    tx.commit();
}

std::vector<ApiKeyInfo> Store::list_api_keys(pqxx::connection_base& c) {
    pqxx::nontransaction tx(c);
    std::vector<ApiKeyInfo> out;
    for (const auto& row : tx.exec("SELECT name, scope, to_char(created_at AT TIME ZONE 'UTC', "
                                   "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), coalesce(to_char(revoked_at AT TIME ZONE 'UTC', "
                                   "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), '') FROM api_keys ORDER BY name"))
        out.push_back({row[0].c_str(), row[1].c_str(), row[2].c_str(), row[3].c_str()});
    return out;
}

std::optional<std::pair<std::string, std::string>> Store::check_api_key(pqxx::connection_base& c,
                                                                        const std::string& key) {
    // imk_<16 hex>_<64 hex>: the row by its public id, then the hashes.
    if (key.size() != 4 + 16 + 1 + 64 || key.compare(0, 4, "imk_") != 0 || key[20] != '_') return std::nullopt;
    pqxx::nontransaction tx(c);
    auto r = tx.exec_params("SELECT name, scope, encode(key_sha256, 'hex') FROM api_keys "
                            "WHERE key_id = $1 AND revoked_at IS NULL",
                            key.substr(4, 16));
    const std::string given = token_hash_hex(key);
    // Compared even when no row matched, so both paths cost the same.
    const std::string stored = r.empty() ? std::string(given.size(), '-') : std::string(r[0][2].c_str());
    const bool same = stored.size() == given.size() && CRYPTO_memcmp(stored.data(), given.data(), given.size()) == 0;
    if (r.empty() || !same) return std::nullopt;
    return std::make_pair(std::string(r[0][0].c_str()), std::string(r[0][1].c_str()));
}

std::optional<Identity> Store::backend_sender(pqxx::connection_base& c, const std::string& user) {
    const std::string device = std::string(backend_device_prefix) + token_hash_hex(user).substr(0, 40);
    pqxx::work tx(c);
    // Made on first use; a revocation of it (no caller can name it) is undone.
    auto r = tx.exec_params(
        "WITH ins AS (INSERT INTO devices (device_id, user_id, token_sha256) "
        "  SELECT $1, $2, decode($3, 'hex') WHERE EXISTS (SELECT 1 FROM users WHERE user_id = $2) "
        "  ON CONFLICT (device_id) DO UPDATE SET revoked_at = NULL WHERE devices.revoked_at IS NOT NULL "
        "  RETURNING encode(token_sha256, 'hex')) "
        "SELECT * FROM ins UNION ALL "
        "SELECT encode(token_sha256, 'hex') FROM devices WHERE device_id = $1 AND user_id = $2 AND revoked_at IS NULL",
        device, user, token_hash_hex(random_token()));
    tx.commit();
    if (r.empty()) return std::nullopt;
    Identity who;
    who.user = user;
    who.device = device;
    who.token_sha256 = r[0][0].c_str();
    return who;
}

bool Store::lab_database(pqxx::connection_base& c, bool fresh) {
    pqxx::nontransaction tx(c);
    if (fresh) {
        tx.exec("CREATE TABLE IF NOT EXISTS lab_marker (created_at timestamptz NOT NULL DEFAULT now())");
        tx.exec("INSERT INTO lab_marker DEFAULT VALUES");
        return true;
    }
    return !tx.exec("SELECT 1 FROM pg_class WHERE relname = 'lab_marker' "
                    "AND relnamespace = current_schema()::regnamespace")
                .empty();
}

void Store::lab_drop_unique_index(pqxx::connection_base& c) {
    pqxx::nontransaction(c).exec("DROP INDEX IF EXISTS events_idempotency");
}

} // namespace im
