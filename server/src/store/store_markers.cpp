// The store's markers and the conversation list: convs (with `unread`),
// ack (delivery marker per device), read (read marker per user).
#include "store/lab_schema.hpp"
#include "store/store_internal.hpp"

#include <string_view>

namespace im {

using namespace store_detail;

namespace {

// ---- unread ---------------------------------------------------------------
// unread = msg events from others in (read, head] the user may read and that
// are not recalled. Computed from running ordinals with index lookups, so the
// cost does not grow with the length of the unread range. The SQL below
// reads, for one conversation `c` and the user $1:

// Msg events with seq <= X among the events still stored (purged ones never
// count): the running count of the last event at or below X, else the base
// just before the first stored event, else 0.
std::string msgs_upto(const std::string& x) {
    return "COALESCE((SELECT e.msg_ordinal FROM events e WHERE e.conv_id = c.conv_id AND e.seq <= " + x +
           " ORDER BY e.seq DESC LIMIT 1), (SELECT e.msg_ordinal - (e.kind = 'msg')::int FROM events e "
           "WHERE e.conv_id = c.conv_id ORDER BY e.seq LIMIT 1), 0)";
}

// The user's own msg events with seq <= X (index events_by_sender).
std::string own_upto(const std::string& x) {
    return "COALESCE((SELECT e.sender_ordinal FROM events e WHERE e.conv_id = c.conv_id AND e.sender_user = $1 "
           "AND e.kind = 'msg' AND e.seq <= " + x + " ORDER BY e.seq DESC LIMIT 1), "
           "(SELECT e.sender_ordinal - 1 FROM events e WHERE e.conv_id = c.conv_id AND e.sender_user = $1 "
           "AND e.kind = 'msg' ORDER BY e.seq LIMIT 1), 0)";
}

// Recalled msgs of others with a target in (A, B] (index events_recall_target).
std::string recalled_in(const std::string& a, const std::string& b) {
    return "(SELECT count(*) FROM events rv JOIN events tg ON tg.conv_id = rv.conv_id AND tg.seq = rv.target_seq "
           "WHERE rv.conv_id = c.conv_id AND rv.kind = 'recall' AND rv.target_seq > " + a +
           " AND rv.target_seq <= " + b + " AND tg.sender_user <> $1)";
}

// One page of the user's conversations in conv_id order after `after`, in
// ONE statement: a range scan of membership_by_user (user_id, conv_id), one
// row more than asked (tells whether more remain), and per conversation a
// lateral join over the user's membership periods for head and unread.
// The first column says whether the caller may list at all (its device
// still valid; for the backend API: the user exists); a page without
// conversations is one row with NULLs after it.
// Device: $1 user, $2 device, $3 token hash, $4 after, $5 rows.
// Backend API: $1 user, $2 after, $3 rows; `delivered` is the furthest any
// of the user's devices acknowledged (docs/integration.md).
std::string convs_sql(bool backend) {
    const std::string after = backend ? "$2" : "$4", rows = backend ? "$3" : "$5";
    const std::string ok = backend ? "EXISTS (SELECT 1 FROM users WHERE user_id = $1)" : device_valid_sql(2, 1, 3);
    const std::string delivered =
        backend ? "(SELECT max(dm.delivered) FROM delivery_markers dm JOIN devices dv ON dv.device_id = dm.device_id "
                  "WHERE dm.conv_id = c.conv_id AND dv.user_id = $1)"
                : "(SELECT dm.delivered FROM delivery_markers dm WHERE dm.conv_id = c.conv_id AND dm.device_id = $2)";
    return "SELECT g.ok, x.conv_id, x.kind, x.head, x.epoch, x.min_seq, x.delivered, x.rd, x.unread "
           "FROM (SELECT " + ok + " AS ok) g "
           "LEFT JOIN LATERAL ("
           " SELECT c.conv_id, c.kind, h.head, c.epoch, c.min_seq, COALESCE(" + delivered + ", 0) AS delivered, "
           "        k.rd, u.unread "
           // conv_id order is byte order whatever the database's collation:
           // compared and sorted COLLATE "C", read in that order from the
           // index membership_by_user (schema/011), and joined back to the
           // primary key of conversations in the database's own collation.
           " FROM (SELECT DISTINCT conv_id COLLATE \"C\" AS k FROM membership_periods "
           "       WHERE user_id = $1 AND conv_id COLLATE \"C\" > " + after +
           "       ORDER BY 1 LIMIT " + rows + ") m "
           " JOIN conversations c ON c.conv_id = m.k COLLATE \"default\" "
           " CROSS JOIN LATERAL (SELECT COALESCE((SELECT rm.read FROM read_markers rm "
           "     WHERE rm.conv_id = c.conv_id AND rm.user_id = $1), 0) AS rd) k "
           // A former member learns nothing of traffic after their last period.
           " CROSS JOIN LATERAL (SELECT CASE WHEN bool_or(p.to_seq IS NULL) THEN c.next_seq - 1 "
           "     ELSE max(p.to_seq) END AS head "
           "     FROM membership_periods p WHERE p.conv_id = c.conv_id AND p.user_id = $1) h "
           // (a, b]: the part of (read, head] inside each period, above the purge line.
           " CROSS JOIN LATERAL (SELECT GREATEST(COALESCE(sum(" + msgs_upto("pr.b") + " - " + msgs_upto("pr.a") +
           "     - (" + own_upto("pr.b") + " - " + own_upto("pr.a") + ") - " + recalled_in("pr.a", "pr.b") +
           "), 0), 0)::bigint AS unread "
           "     FROM (SELECT GREATEST(k.rd, p.from_seq - 1, c.min_seq - 1) AS a, "
           "                  LEAST(h.head, COALESCE(p.to_seq, h.head)) AS b "
           "           FROM membership_periods p WHERE p.conv_id = c.conv_id AND p.user_id = $1) pr "
           "     WHERE pr.b > pr.a) u "
           " WHERE g.ok"
           ") x ON true "
           "ORDER BY x.conv_id COLLATE \"C\"";
}

// ack and read, one statement each (autocommit): the caller's device row
// held FOR SHARE until the statement ends, behind the device's gate, as
// im_send does for sends (schema/functions/im_send.sql, im_device_gate.sql), so a revocation or a new token waits for
// it and one that committed first makes it DEVICE_REVOKED; then the install
// rule, membership and head, and the marker moved forward only when all
// hold. Columns: the verdict (OK, DEVICE_REVOKED, STALE_INSTALL,
// NOT_MEMBER, CURSOR_AHEAD), the marker after the statement (NULL unless
// OK); read adds the marker before it.
// $1 device, $2 user, $3 token hash, $4 conv, $5 install, $6 seq.
// The install rule is one condition of the verdict; the lab's variant for
// its negative control of STALE_INSTALL turns exactly this text off
// (lab_markers_statements, prepared only behind --enable-faults), keeping
// $5 typed.
constexpr std::string_view install_rule = "(SELECT install FROM d) <> $5::text";
constexpr std::string_view install_rule_off = "false AND $5::text IS NOT NULL";

std::string marker_sql(bool read) {
    std::string sql =
        "WITH d AS (SELECT coalesce(d.current_install, '') AS install FROM devices d WHERE " +
        device_valid_where(1, 2, 3) + " AND im_device_gate_shared($1::text) FOR SHARE), "
        "a AS (SELECT count(*) AS n, CASE WHEN bool_or(p.to_seq IS NULL) "
        "      THEN (SELECT c.next_seq - 1 FROM conversations c WHERE c.conv_id = $4::text) "
        "      ELSE max(p.to_seq) END AS head "
        "      FROM membership_periods p WHERE p.conv_id = $4::text AND p.user_id = $2::text), "
        "v AS (SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM d) THEN 'DEVICE_REVOKED' "
        "      WHEN " + std::string(install_rule) + " THEN 'STALE_INSTALL' "
        "      WHEN a.n = 0 THEN 'NOT_MEMBER' "
        "      WHEN $6::bigint > a.head THEN 'CURSOR_AHEAD' ELSE 'OK' END AS code FROM a), ";
    if (!read)
        return sql +
               "up AS (INSERT INTO delivery_markers (conv_id, device_id, delivered) "
               "       SELECT $4::text, $1::text, $6::bigint FROM v WHERE v.code = 'OK' "
               "       ON CONFLICT (conv_id, device_id) DO UPDATE "
               "       SET delivered = GREATEST(delivery_markers.delivered, EXCLUDED.delivered) "
               "       RETURNING delivered) "
               "SELECT v.code, (SELECT delivered FROM up) FROM v";
    // The marker before, locked (FOR UPDATE) only once the checks passed:
    // `w` reads it before `up` writes it (up's rows come from w), so two
    // reads of one user serialise and each sees the other's marker.
    return sql +
           "old AS (SELECT rm.read FROM read_markers rm WHERE rm.conv_id = $4::text AND rm.user_id = $2::text "
           "        FOR UPDATE), "
           "w AS (SELECT v.code, CASE WHEN v.code = 'OK' THEN COALESCE((SELECT read FROM old), 0) END AS before "
           "      FROM v), "
           "up AS (INSERT INTO read_markers (conv_id, user_id, read) "
           "       SELECT $4::text, $2::text, $6::bigint FROM w WHERE w.code = 'OK' "
           "       ON CONFLICT (conv_id, user_id) DO UPDATE SET read = GREATEST(read_markers.read, EXCLUDED.read) "
           "       RETURNING read) "
           "SELECT w.code, (SELECT read FROM up), w.before FROM w";
}

// Every statement of this part, prepared per connection (prepare_all).
const Statements& markers_statements() {
    static const Statements table{
        {"im_convs", convs_sql(false)},
        {"im_convs_backend", convs_sql(true)},
        {"im_ack", marker_sql(false)},
        {"im_read", marker_sql(true)},
    };
    return table;
}

// Lab only (rule.stale_install armed, which needs --enable-faults): the
// same statements without the install rule, prepared when first chosen.
const Statements& lab_markers_statements() {
    static const Statements table{
        {"im_lab_ack_stale_install", lab_rule_off(marker_sql(false), install_rule, install_rule_off, "ack_stale_install")},
        {"im_lab_read_stale_install", lab_rule_off(marker_sql(true), install_rule, install_rule_off, "read_stale_install")},
    };
    return table;
}

// im_ack / im_read, or (lab) its variant that breaks the armed rule.
const char* marker_statement_name(FaultRegistry& faults, pqxx::connection_base& c, bool read) {
    if (!faults.broken("rule.stale_install")) return read ? "im_read" : "im_ack";
    prepare_all(c, lab_markers_statements());
    return read ? "im_lab_read_stale_install" : "im_lab_ack_stale_install";
}

// The verdict of im_ack / im_read as an error, nullopt for OK.
std::optional<Error> marker_verdict(std::string_view code) {
    if (code == "OK") return std::nullopt;
    if (code == "DEVICE_REVOKED") return device_revoked();
    if (code == "STALE_INSTALL") return stale_install();
    if (code == "NOT_MEMBER") return not_member();
    if (code == "CURSOR_AHEAD") return Error{Code::cursor_ahead, "seq is beyond head"};
    throw std::runtime_error("marker statement: unknown verdict " + std::string(code));
}

// Runs a marker statement: autocommit, or (lab faults armed) inside a
// transaction so the fault point `point` can fail it before COMMIT.
// Returns the row, or the injected failure.
template <class... Args>
Outcome<pqxx::row> marker_statement(pqxx::connection_base& c, FaultRegistry& faults, const char* name,
                                    const char* point, Args&&... args) {
    if (!faults.enabled()) {
        pqxx::nontransaction tx(c);
        auto r = tx.exec_prepared(name, std::forward<Args>(args)...);
        return r[0];
    }
    pqxx::work tx(c);
    auto r = tx.exec_prepared(name, std::forward<Args>(args)...);
    if (std::string_view(r[0][0].c_str()) == "OK" && faults.hit(point) == FaultKind::unavailable)
        return unavailable("injected fault");
    tx.commit();
    return r[0];
}

} // namespace

// ---------------------------------------------------------------- convs

Outcome<ConvList> Store::convs(pqxx::connection_base& c, const Identity& who, const req::Convs& q) {
    return guarded<ConvList>("convs", [&]() -> Outcome<ConvList> {
        prepare_all(c, markers_statements());
        pqxx::nontransaction tx(c); // one statement, one snapshot
        const pqxx::result r = who.backend
            ? tx.exec_prepared("im_convs_backend", who.user, q.after, q.limit + 1)
            : tx.exec_prepared("im_convs", who.user, who.device, who.token_sha256, q.after, q.limit + 1);
        if (!r[0][0].as<bool>()) {
            if (who.backend) return Error{Code::not_found, "no such user"};
            return device_revoked();
        }
        ConvList out;
        std::size_t bytes = 0;
        for (const auto& row : r) {
            if (row[1].is_null()) break; // no conversation on this page
            if (static_cast<std::int64_t>(out.convs.size()) >= q.limit) {
                out.has_more = true;
                break;
            }
            ConvInfo ci;
            ci.conv = row[1].c_str();
            ci.kind = row[2].c_str();
            ci.head = row[3].as<std::int64_t>();
            ci.epoch = row[4].as<std::int64_t>();
            ci.min_seq = row[5].as<std::int64_t>();
            ci.delivered = row[6].as<std::int64_t>();
            ci.read = row[7].as<std::int64_t>();
            ci.unread = row[8].as<std::int64_t>();
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
        prepare_all(c, markers_statements());
        auto row = marker_statement(c, faults_, marker_statement_name(faults_, c, false), "store.ack_before_commit",
                                    who.device, who.user, who.token_sha256, a.conv, who.install, a.seq);
        if (!row) return row.error();
        if (auto e = marker_verdict(row.value()[0].c_str())) return *e;
        return Acked{a.conv, row.value()[1].as<std::int64_t>()};
    });
}

Outcome<ReadOk> Store::read(pqxx::connection_base& c, const Identity& who, const req::Read& rd, Notes& notes) {
    return guarded<ReadOk>("read", [&]() -> Outcome<ReadOk> {
        prepare_all(c, markers_statements());
        auto row = marker_statement(c, faults_, marker_statement_name(faults_, c, true), "store.read_before_commit",
                                    who.device, who.user, who.token_sha256, rd.conv, who.install, rd.seq);
        if (!row) return row.error();
        if (auto e = marker_verdict(row.value()[0].c_str())) return *e;
        const std::int64_t now = row.value()[1].as<std::int64_t>(), before = row.value()[2].as<std::int64_t>();
        // The user's other devices learn of it through the gateways.
        if (now > before && !faults_.broken("rule.read_hint"))
            notes.push_back("r " + rd.conv + " " + who.user + " " + who.device + " " + std::to_string(now));
        return ReadOk{rd.conv, now};
    });
}

} // namespace im
