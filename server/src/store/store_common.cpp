// Helpers the parts of the store share (store_internal.hpp).
#include "store/store_internal.hpp"

#include "core/digest.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <fstream>
#include <stdexcept>

namespace im::store_detail {

void prepare_all(pqxx::connection_base& c, const Statements& table) {
    for (const auto& s : table) c.prepare(s.name, s.sql);
}

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

std::string device_valid_where(int dev, int user, int tok) {
    return "d.device_id = $" + std::to_string(dev) + " AND d.user_id = $" + std::to_string(user) +
           " AND d.token_sha256 = decode($" + std::to_string(tok) + ", 'hex') AND d.revoked_at IS NULL";
}

std::string device_valid_sql(int dev, int user, int tok) {
    return "EXISTS (SELECT 1 FROM devices d WHERE " + device_valid_where(dev, user, tok) + ")";
}

std::string event_columns() {
    return std::string("conv_id, seq, mid::text, kind, sender_user, body, target_seq, subject_user, ") + ts_ms +
           ", epoch, client_msg_id, reply_to, emoji, react_on, attachments::text, erased";
}

std::string with_changes(const std::string& events_sql, const std::string& lo, const std::string& hi, int viewer) {
    const std::string v = "$" + std::to_string(viewer);
    // Two branches, one of which runs (a one-time filter each), chosen by
    // two index probes over the page's seq range [lo, hi] (from the
    // parameters: seqs are gap-free below the head): is there a changed
    // msg (a msg_changes row) or a recall in it? No: the events' own
    // statement and nothing more, so a plain page costs what it cost before
    // contract v3 (a materialized copy of the events, the joins and their
    // sort cost it 2x the statement time). Yes: the events materialized
    // (a CTE runs only when read), a hash join to msg_changes, which holds
    // each msg's reactions summary as written (reactions_top, schema/018:
    // the top 20 as JSON text, kept by im_change), and for a msg with one,
    // the viewer's own emoji on it (`me`: an index probe of
    // reaction_state_by_user, imserver marks the summary's emoji with it),
    // and a probe of the recall index per msg. Before the summary this
    // branch ranked every count of the page's messages and built their
    // lists on every read (the heavy page's statement 2-4x this one's,
    // docs/benchmarks.md, "Pages with edits and reactions"). The viewer's
    // emoji are probed per msg, not joined as a set: a generic plan (a
    // prepared statement's, from the sixth call) guesses one event and one
    // row per CTE, and put a set of them in a nested loop over the events
    // (201 x 149 rows, 20 ms on the heavy page); the probe's cost does not
    // depend on an estimate (150 probes, about 1 ms there).
    // No ORDER BY: the caller puts the rows in seq order (rows_in_seq_order).
    const std::string range = " BETWEEN " + lo + " AND " + hi;
    return "WITH has AS (SELECT EXISTS (SELECT 1 FROM msg_changes x WHERE x.conv_id = $1 AND x.seq" + range +
           ") OR EXISTS (SELECT 1 FROM events r WHERE r.conv_id = $1 AND r.kind = 'recall' AND r.target_seq" + range +
           ") AS any_change), "
           "ev AS MATERIALIZED (" + events_sql + ") "
           "SELECT e.*, NULL::bigint, NULL::text, NULL::bigint, NULL::bigint, false, NULL::text, NULL::text FROM (" +
           events_sql + ") e WHERE NOT (SELECT any_change FROM has) "
           "UNION ALL "
           "SELECT ev.*, x.edit_seq, x.edit_body, floor(extract(epoch from x.edit_at) * 1000)::bigint, "
           "x.reactions_seq, "
           "ev.kind = 'msg' AND EXISTS (SELECT 1 FROM events r WHERE r.conv_id = ev.conv_id AND r.kind = 'recall' "
           "AND r.target_seq = ev.seq), x.reactions_top, "
           "CASE WHEN x.reactions_top IS NOT NULL THEN (SELECT json_agg(s.emoji)::text FROM reaction_state s "
           "WHERE s.conv_id = ev.conv_id AND s.user_id = " + v + "::text AND s.target_seq = ev.seq AND s.is_on) END "
           "FROM ev LEFT JOIN msg_changes x ON ev.kind = 'msg' AND x.conv_id = ev.conv_id AND x.seq = ev.seq "
           "WHERE (SELECT any_change FROM has)";
}

std::string event_page_sql(bool newest_first) {
    // [$2, $3] holds the page; LIMIT $4 cuts it at the end it starts from.
    return newest_first ? with_changes(Store::event_range_sql(true), "GREATEST($2::bigint, $3::bigint - $4::bigint + 1)",
                                       "$3::bigint", 5)
                        : with_changes(Store::event_range_sql(false), "$2::bigint",
                                       "LEAST($3::bigint, $2::bigint + $4::bigint - 1)", 5);
}

std::vector<pqxx::row> rows_in_seq_order(const pqxx::result& r, bool newest_first) {
    // Seqs read once, then indices sorted (a pqxx::row copy is a result's
    // reference count); the plain branch's rows come in order already.
    std::vector<std::pair<std::int64_t, pqxx::result::size_type>> keys;
    keys.reserve(r.size());
    for (pqxx::result::size_type i = 0; i < r.size(); ++i)
        keys.emplace_back(newest_first ? -r[i][1].as<std::int64_t>() : r[i][1].as<std::int64_t>(), i);
    if (!std::is_sorted(keys.begin(), keys.end())) std::sort(keys.begin(), keys.end());
    std::vector<pqxx::row> rows;
    rows.reserve(keys.size());
    for (const auto& k : keys) rows.push_back(r[k.second]);
    return rows;
}

Event read_event(const pqxx::row& row) {
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
    if (!row[11].is_null()) ev.reply_to = row[11].as<std::int64_t>();
    if (!row[12].is_null()) ev.emoji = std::string(row[12].c_str());
    if (!row[13].is_null()) ev.on = row[13].as<bool>();
    if (!row[14].is_null()) ev.attachments = attachments_from_json(row[14].c_str());
    ev.erased = row[15].as<bool>();
    if (row.size() < 23) return ev; // without with_changes' columns
    if (!row[16].is_null()) ev.edit = EditState{row[16].as<std::int64_t>(), row[17].c_str(), row[18].as<std::int64_t>()};
    if (!row[19].is_null()) ev.reactions_seq = row[19].as<std::int64_t>();
    ev.recalled = !row[20].is_null() && row[20].as<bool>();
    if (!row[21].is_null()) {
        // The summary (schema/018): [["emoji", count], ...], top 20 in
        // order; `me` from the viewer's own emoji on this msg (row[22]).
        std::vector<std::string> mine;
        if (!row[22].is_null()) {
            const boost::json::value own = boost::json::parse(row[22].c_str());
            for (const auto& e : own.as_array()) mine.emplace_back(e.as_string());
        }
        const boost::json::value list = boost::json::parse(row[21].c_str());
        for (const auto& item : list.as_array()) {
            const auto& a = item.as_array();
            std::string emoji(a.at(0).as_string());
            const bool me = std::find(mine.begin(), mine.end(), emoji) != mine.end();
            ev.reactions.push_back({std::move(emoji), a.at(1).to_number<std::int64_t>(), me});
        }
    }
    return ev;
}

bool deterministic(const pqxx::sql_error& e) {
    const std::string& state = e.sqlstate();
    return (state.rfind("22", 0) == 0 || state.rfind("23", 0) == 0) && state != "23505";
}

std::string token_hash_hex(const std::string& token) { return sha256_hex(token); }

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

namespace {
const Statements& common_statements() {
    static const Statements table{
        {"im_notify", std::string("SELECT pg_notify('") + notify_channel + "', $1)"},
    };
    return table;
}
} // namespace

void notify(pqxx::transaction_base& tx, const std::string& payload) {
    prepare_all(tx.conn(), common_statements());
    tx.exec_prepared("im_notify", payload);
}

void need_id(const std::string& what, const std::string& id) {
    if (!valid_id(id))
        throw AdminError(AdminError::invalid, what + " must be 1-64 characters of [A-Za-z0-9._:-]: '" + id + "'");
}

} // namespace im::store_detail
