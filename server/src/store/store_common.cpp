// Helpers the parts of the store share (store_internal.hpp).
#include "store/store_internal.hpp"

#include "core/digest.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <charconv>
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
    // One statement (one snapshot) of four independent branches, each one
    // index range scan over the page's seq range [lo, hi] (from the
    // parameters: seqs are gap-free below the head), joined by nothing:
    //   1. the events themselves (events_sql), seven NULL columns after;
    //   2. the msg_changes rows of the range (conv_id NULL, seq the msg's):
    //      the winning edit and reactions_seq, and the reactions summary as
    //      written (reactions_top, schema/018: the top 20 as JSON text,
    //      kept by im_change);
    //   3. the recalls of the range (conv_id NULL, seq the target's,
    //      recalled true);
    //   4. the viewer's own emoji over the range, one row (conv_id and seq
    //      NULL) when there are any: "seq emoji" lines (an emoji holds no
    //      control character, contract section 12), from which imserver
    //      marks `me` in the summaries. Not for an empty viewer (pushes:
    //      `me` is judged for no one).
    // imserver puts each change on its event by seq (event_rows,
    // read_event): a msg shows only changes of its own seq, and rows of a
    // seq outside the events read are ignored. A plain page's branches 2-4
    // find nothing in their index. The forms before this one joined the
    // events to the changes in SQL: the events materialized and hashed
    // (about 0.5 ms of the heavy page's 1.8 ms statement), a recall probe
    // per msg, the viewer's emoji probed per msg (150 probes, about 1 ms),
    // and a generic plan (a prepared statement's, from the sixth call)
    // guesses one row per CTE: sets joined to the events went into nested
    // loops (201 x 149 rows, 20 ms on the heavy page); docs/benchmarks.md,
    // "Pages with edits and reactions" and "The heavy page, taken apart".
    // No ORDER BY: the caller puts the rows in seq order (event_rows).
    const std::string range = " BETWEEN " + lo + " AND " + hi;
    return "SELECT e.*, NULL::bigint, NULL::text, NULL::bigint, NULL::bigint, NULL::boolean, NULL::text, NULL::text "
           "FROM (" + events_sql + ") e "
           "UNION ALL "
           "SELECT NULL, x.seq, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
           "x.edit_seq, x.edit_body, floor(extract(epoch from x.edit_at) * 1000)::bigint, x.reactions_seq, NULL, "
           "x.reactions_top, NULL "
           "FROM msg_changes x WHERE x.conv_id = $1 AND x.seq" + range + " "
           "UNION ALL "
           "SELECT NULL, r.target_seq, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
           "NULL, NULL, NULL, NULL, NULL, true, NULL, NULL "
           "FROM events r WHERE r.conv_id = $1 AND r.kind = 'recall' AND r.target_seq" + range + " "
           "UNION ALL "
           "SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
           "NULL, NULL, NULL, NULL, NULL, NULL, m.mine "
           "FROM (SELECT string_agg(s.target_seq::text || ' ' || s.emoji, E'\\n') AS mine FROM reaction_state s "
           "WHERE s.conv_id = $1 AND s.user_id = " + v + "::text AND s.target_seq" + range + " AND s.is_on) m "
           "WHERE " + v + "::text <> '' AND m.mine IS NOT NULL";
}

std::string event_page_sql(bool newest_first) {
    // [$2, $3] holds the page; LIMIT $4 cuts it at the end it starts from.
    return newest_first ? with_changes(Store::event_range_sql(true), "GREATEST($2::bigint, $3::bigint - $4::bigint + 1)",
                                       "$3::bigint", 5)
                        : with_changes(Store::event_range_sql(false), "$2::bigint",
                                       "LEAST($3::bigint, $2::bigint + $4::bigint - 1)", 5);
}

namespace {

// One row's columns through one field: a pqxx 6 field holds a copy of its
// result (two shared_ptr copies, four atomic operations, per `row[i]`),
// where moving one field to another column of the row is an add
// (docs/benchmarks.md, "Each event written once").
class Columns {
public:
    explicit Columns(const pqxx::row& row) : f_(row.begin()) {}
    const pqxx::field& operator[](pqxx::row::size_type i) {
        f_ += static_cast<pqxx::row::difference_type>(i) - static_cast<pqxx::row::difference_type>(at_);
        at_ = i;
        return *f_.operator->();
    }

private:
    pqxx::row::const_iterator f_;
    pqxx::row::size_type at_ = 0;
};

std::int64_t to_int64(const pqxx::field& f) {
    std::int64_t v = 0;
    const char* s = f.c_str();
    const auto r = std::from_chars(s, s + f.size(), v);
    if (r.ec != std::errc() || r.ptr != s + f.size())
        throw pqxx::conversion_error("not a 64-bit integer: '" + std::string(s, f.size()) + "'");
    return v;
}

// The reactions summary (msg_changes.reactions_top, schema/018): a JSON
// array of [emoji, count] pairs as PostgreSQL writes it (json_agg of
// json_build_array: `[["👍", 5], ["❤", 3]]`). Read without building a
// tree; false (the caller parses it as JSON) for anything else, e.g. an
// emoji written with an escape.
bool read_summary(std::string_view t, std::vector<ReactionCount>& out) {
    std::size_t i = 0;
    const auto ws = [&] {
        while (i < t.size() && (t[i] == ' ' || t[i] == '\n' || t[i] == '\t' || t[i] == '\r')) ++i;
    };
    const auto eat = [&](char c) {
        ws();
        if (i >= t.size() || t[i] != c) return false;
        ++i;
        return true;
    };
    if (!eat('[')) return false;
    if (eat(']')) return true;
    for (;;) {
        if (!eat('[') || !eat('"')) return false;
        const std::size_t end = t.find('"', i);
        if (end == std::string_view::npos) return false;
        const std::string_view emoji = t.substr(i, end - i);
        if (emoji.find('\\') != std::string_view::npos) return false;
        i = end + 1;
        if (!eat(',')) return false;
        ws();
        std::int64_t count = 0;
        const auto r = std::from_chars(t.data() + i, t.data() + t.size(), count);
        if (r.ec != std::errc()) return false;
        i = static_cast<std::size_t>(r.ptr - t.data());
        if (!eat(']')) return false;
        out.push_back({std::string(emoji), count, false});
        if (eat(']')) break;
        if (!eat(',')) return false;
    }
    ws();
    return i == t.size();
}

} // namespace

EventRows event_rows(const pqxx::result& r, bool newest_first) {
    // Seqs read once, then indices sorted (a pqxx::row copy is a result's
    // reference count); the events' rows come in order already. Rows with
    // a NULL conv_id are changes (with_changes' branches 2-4).
    EventRows out;
    std::vector<std::pair<std::int64_t, pqxx::result::size_type>> keys;
    keys.reserve(r.size());
    for (pqxx::result::size_type i = 0; i < r.size(); ++i) {
        const auto row = r[i];
        Columns col(row);
        if (!col[0].is_null()) {
            const auto seq = to_int64(col[1]);
            keys.emplace_back(newest_first ? -seq : seq, i);
        } else if (!col[1].is_null()) {
            const auto seq = to_int64(col[1]);
            if (!col[20].is_null()) out.recalled.push_back(seq);
            else out.changes.emplace_back(seq, row);
        } else if (!col[22].is_null()) {
            // "seq emoji" lines; an emoji has no control character.
            const std::string_view text(col[22].c_str(), col[22].size());
            for (std::size_t at = 0; at < text.size();) {
                std::size_t end = text.find('\n', at);
                if (end == std::string_view::npos) end = text.size();
                const auto line = text.substr(at, end - at);
                const auto sp = line.find(' ');
                std::int64_t seq = 0;
                if (sp != std::string_view::npos &&
                    std::from_chars(line.data(), line.data() + sp, seq).ec == std::errc())
                    out.mine.emplace_back(seq, std::string(line.substr(sp + 1)));
                at = end + 1;
            }
        }
    }
    if (!std::is_sorted(keys.begin(), keys.end())) std::sort(keys.begin(), keys.end());
    out.rows.reserve(keys.size());
    for (const auto& k : keys) out.rows.push_back(r[k.second]);
    const auto by_seq = [](const auto& a, const auto& b) { return a.first < b.first; };
    std::sort(out.changes.begin(), out.changes.end(), by_seq);
    std::sort(out.recalled.begin(), out.recalled.end());
    std::sort(out.mine.begin(), out.mine.end());
    return out;
}

Event read_event(const pqxx::row& row) {
    Columns col(row);
    Event ev;
    ev.conv.assign(col[0].c_str(), col[0].size());
    ev.seq = to_int64(col[1]);
    ev.mid.assign(col[2].c_str(), col[2].size());
    ev.kind.assign(col[3].c_str(), col[3].size());
    if (!col[4].is_null()) ev.sender.assign(col[4].c_str(), col[4].size());
    if (!col[5].is_null()) ev.body.emplace(col[5].c_str(), col[5].size());
    if (!col[6].is_null()) ev.target = to_int64(col[6]);
    if (!col[7].is_null()) {
        ev.user.emplace(col[7].c_str(), col[7].size());
        if (ev.sender.empty()) ev.sender = *ev.user;
    }
    ev.ts = to_int64(col[8]);
    ev.epoch = to_int64(col[9]);
    if (!col[10].is_null()) ev.cmid.emplace(col[10].c_str(), col[10].size());
    if (!col[11].is_null()) ev.reply_to = to_int64(col[11]);
    if (!col[12].is_null()) ev.emoji.emplace(col[12].c_str(), col[12].size());
    if (!col[13].is_null()) ev.on = col[13].as<bool>();
    if (!col[14].is_null()) ev.attachments = attachments_from_json(std::string_view(col[14].c_str(), col[14].size()));
    ev.erased = col[15].as<bool>();
    return ev;
}

Event read_event(const pqxx::row& row, const EventRows& with) {
    Event ev = read_event(row);
    if (ev.kind != "msg") return ev; // later changes are a msg's only
    ev.recalled = std::binary_search(with.recalled.begin(), with.recalled.end(), ev.seq);
    const auto c = std::lower_bound(with.changes.begin(), with.changes.end(), ev.seq,
                                    [](const auto& a, std::int64_t seq) { return a.first < seq; });
    if (c == with.changes.end() || c->first != ev.seq) return ev;
    Columns x(c->second);
    if (!x[16].is_null()) {
        const std::int64_t seq = to_int64(x[16]);
        std::string body(x[17].c_str(), x[17].size());
        ev.edit = EditState{seq, std::move(body), to_int64(x[18])};
    }
    if (!x[19].is_null()) ev.reactions_seq = to_int64(x[19]);
    if (!x[21].is_null()) {
        // The summary (schema/018): [["emoji", count], ...], top 20 in
        // order; `me` when the viewer's emoji on this msg have it.
        const std::string_view text(x[21].c_str(), x[21].size());
        ev.reactions.reserve(max_reactions);
        if (!read_summary(text, ev.reactions)) {
            // Not in the form PostgreSQL writes: read as any JSON, into a
            // buffer on the stack (a monotonic resource).
            ev.reactions.clear();
            unsigned char buf[4096];
            boost::json::monotonic_resource mr(buf, sizeof buf);
            const boost::json::value list = boost::json::parse(text, &mr);
            for (const auto& item : list.as_array()) {
                const auto& a = item.as_array();
                ev.reactions.push_back({std::string(a.at(0).as_string()), a.at(1).to_number<std::int64_t>(), false});
            }
        }
        const auto own = std::equal_range(with.mine.begin(), with.mine.end(), std::make_pair(ev.seq, std::string()),
                                          [](const auto& a, const auto& b) { return a.first < b.first; });
        for (auto it = own.first; it != own.second; ++it)
            for (auto& r : ev.reactions)
                if (r.emoji == it->second) r.me = true;
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
