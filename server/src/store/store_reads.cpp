// The store's reads: sync, history and fetch (contract sections 6-7), and
// the fan-out's reads of committed events and members (notifier.cpp).
#include "store/store_internal.hpp"

#include <algorithm>
#include <stdexcept>

namespace im {

using namespace store_detail;

namespace {

// Every statement of this part, prepared per connection (prepare_all).
const Statements& reads_statements() {
    static const Statements table{
        // The caller's device still valid (section 4: a revoked device reads
        // no more events), the conversation row and the caller's periods, in
        // one statement (one round trip, one snapshot): what every read
        // request starts with. $1 conv, $2 user, $3 device, $4 token hash.
        {"im_conv_access",
         std::string("SELECT c.kind, c.next_seq, c.epoch, c.min_seq, c.recall_window_ms, c.push_full_max, "
                     "p.from_seq, p.to_seq, p.from_seq IS NOT NULL, dv.ok "
                     "FROM (SELECT ") + device_valid_sql(3, 2, 4) + " AS ok) dv "
         "LEFT JOIN conversations c ON c.conv_id = $1 "
         "LEFT JOIN membership_periods p ON p.conv_id = c.conv_id AND p.user_id = $2 "
         "ORDER BY p.from_seq"},
        // $5 (im_event: $3): the caller's user, for `me` in reactions.
        {"im_events_asc", event_page_sql(false)},
        {"im_events_desc", event_page_sql(true)},
        {"im_event", with_changes("SELECT " + event_columns() + " FROM events WHERE conv_id = $1 AND seq = $2",
                                  "$2::bigint", "$2::bigint", 3)},
        // The lab's broken page cursor (rule.page_cursor): the head now.
        {"im_conv_head", "SELECT next_seq - 1 FROM conversations WHERE conv_id = $1"},
        {"im_conv_row", std::string("SELECT ") + conv_columns + " FROM conversations WHERE conv_id = $1"},
        // The fan-out: events [from, to] of a commit, who may read them.
        // A push is one frame for every recipient: `me` is judged for no
        // user ($4 is empty; docs/protocol.md, "Reactions in pushes").
        {"im_push_events",
         with_changes("SELECT " + event_columns() + " FROM events WHERE conv_id = $1 AND seq >= $2 AND seq <= $3",
                      "$2::bigint", "$3::bigint", 4)},
        {"im_conv_periods", "SELECT user_id, from_seq, to_seq FROM membership_periods WHERE conv_id = $1"},
        {"im_push_members",
         "SELECT m.user_id, m.from_seq, m.to_seq, c.push_full_max FROM conversations c "
         "LEFT JOIN membership_periods m ON m.conv_id = c.conv_id WHERE c.conv_id = $1"},
        // Of the (device, token hash) pairs of open connections, those whose
        // token stopped working.
        {"im_stale_tokens",
         "SELECT o.dev, o.h FROM unnest($1::text[], $2::text[]) AS o(dev, h) "
         "LEFT JOIN devices d ON d.device_id = o.dev "
         "WHERE d.device_id IS NULL OR d.revoked_at IS NOT NULL "
         "   OR d.token_sha256 IS DISTINCT FROM decode(o.h, 'hex')"},
    };
    return table;
}

void prepare_reads(pqxx::connection_base& c) { prepare_all(c, reads_statements()); }

// A read is ordered by im_conv_access: one that began before a revocation
// committed is answered as of then.
Outcome<std::pair<ConvRow, Access>> load_conv_access(pqxx::transaction_base& tx, const std::string& conv,
                                                     const Identity& who) {
    auto r = tx.exec_prepared("im_conv_access", conv, who.user, who.device, who.token_sha256);
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
    // A former member learns nothing of traffic after their last period.
    a.head = a.open ? c.next_seq - 1 : last_to;
    return std::make_pair(std::move(c), std::move(a));
}

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
    // The events written as they are taken: their size for the budget is
    // the bytes written, and the frame copies the text (each event is
    // encoded once).
    EventListWriter text;

    Collector(std::int64_t want_) : want(want_) {
        events.reserve(static_cast<std::size_t>(std::clamp<std::int64_t>(want, 0, max_sync_limit)));
    }

    // Seqs in [lo, hi] are gap-free (purges only remove below min_seq), so a
    // range read in its own statement must come back whole: first..last
    // consecutive, as many rows as asked or the whole range.
    bool whole(const std::vector<pqxx::row>& r, std::int64_t lo, std::int64_t hi, std::int64_t limit,
               bool newest_first) const {
        std::int64_t expect = newest_first ? hi : lo;
        for (const auto& row : r) {
            if (row[1].as<std::int64_t>() != expect) return false;
            expect += newest_first ? -1 : 1;
        }
        return static_cast<std::int64_t>(r.size()) == std::min(limit, hi - lo + 1);
    }

    // Adds the rows in order; false once the page is full.
    bool take(const EventRows& r) {
        for (const auto& row : r.rows) {
            if (static_cast<std::int64_t>(events.size()) >= want) {
                cut = true;
                return false;
            }
            Event ev = read_event(row, r);
            const std::size_t n = text.add(ev);
            if (!events.empty() && bytes + n > page_item_budget) {
                text.drop_last();
                cut = true;
                return false;
            }
            bytes += n;
            events.push_back(std::move(ev));
        }
        return true;
    }
};

// Read requests run as autocommit statements (no BEGIN/COMMIT round trips).
// The first reads the conversation row and the caller's periods; every
// event up to the head it saw is committed (commit order = seq order under
// the row lock), so later statements see them all, unless a purge removed
// some in between: then the reply is read again inside one snapshot.
template <class T, class Read>
Outcome<T> read_request(pqxx::connection_base& c, Read read) {
    prepare_reads(c);
    bool raced = false;
    {
        pqxx::nontransaction tx(c);
        auto o = read(tx, raced);
        if (!raced) return o;
    }
    pqxx::transaction<pqxx::repeatable_read, pqxx::read_only> tx(c);
    return read(tx, raced);
}

} // namespace

std::string Store::event_range_sql(bool newest_first) {
    return "SELECT " + event_columns() + " FROM events WHERE conv_id = $1 AND seq >= $2 AND seq <= $3 ORDER BY seq" +
           (newest_first ? " DESC" : "") + " LIMIT $4";
}

// ---------------------------------------------------------------- sync / history

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
        Collector col(s.limit);
        for (const auto& per : access.periods) { // ascending from_seq
            std::int64_t lo = std::max({s.after + 1, per.from, conv->min_seq});
            std::int64_t hi = std::min(per.to, access.head);
            if (lo > hi) continue;
            // One row more than still fits tells whether more remain.
            const std::int64_t limit = col.want - static_cast<std::int64_t>(col.events.size()) + 1;
            const auto r = event_rows(tx.exec_prepared("im_events_asc", s.conv, lo, hi, limit, who.user), false);
            if (!col.whole(r.rows, lo, hi, limit, false)) {
                raced = true;
                return Error{Code::unavailable, "purged while read"};
            }
            if (!col.take(r)) break;
        }
        p.events = std::move(col.events);
        p.events_text = col.text.list(false);
        p.events_text_count = col.text.count();
        p.has_more = col.cut;
        p.next_after = p.has_more ? p.events.back().seq : access.head;
        if (faults_.broken("rule.page_cursor")) { // lab negative control only: the cursor is "the head now"
            auto h = tx.exec_prepared("im_conv_head", s.conv);
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
        Collector col(h.limit);
        for (auto it = access.periods.rbegin(); it != access.periods.rend(); ++it) { // newest period first
            std::int64_t lo = std::max(it->from, conv->min_seq);
            std::int64_t hi = std::min({it->to, access.head, before - 1});
            if (lo > hi) continue;
            const std::int64_t limit = col.want - static_cast<std::int64_t>(col.events.size()) + 1;
            const auto r = event_rows(tx.exec_prepared("im_events_desc", h.conv, lo, hi, limit, who.user), true);
            if (!col.whole(r.rows, lo, hi, limit, true)) {
                raced = true;
                return Error{Code::unavailable, "purged while read"};
            }
            if (!col.take(r)) break;
        }
        std::reverse(col.events.begin(), col.events.end());
        p.events = std::move(col.events);
        p.events_text = col.text.list(true); // taken newest first
        p.events_text_count = col.text.count();
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
        prepare_reads(c);
        // Two autocommit statements: the event is committed if seq <= head;
        // a purge in between makes it NOT_FOUND, as it would be a moment later.
        pqxx::nontransaction tx(c);
        auto loaded = load_conv_access(tx, f.conv, who);
        if (!loaded) return loaded.error();
        auto& access = loaded->second;
        if (!access.any()) return not_member();
        if (f.seq < 1 || f.seq > access.head) return Error{Code::not_found, "no such event"};
        if (!access.can_read(f.seq)) return not_member();
        const auto r = event_rows(tx.exec_prepared("im_event", f.conv, f.seq, who.user), false);
        if (r.rows.empty()) return Error{Code::not_found, "no such event"};
        return Fetched{read_event(r.rows[0], r)};
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
    prepare_reads(c);
    pqxx::transaction<pqxx::repeatable_read, pqxx::read_only> tx(c);
    auto row = tx.exec_prepared("im_conv_row", conv);
    if (row.empty()) return std::nullopt;
    const ConvRow conv_row_ = conv_row(row[0]);
    PushBatch b;
    b.head = conv_row_.next_seq - 1;
    b.epoch = conv_row_.epoch;
    if (from <= to) {
        const auto rows = event_rows(tx.exec_prepared("im_push_events", conv, from, to, std::string()), false);
        for (const auto& r : rows.rows) b.events.push_back(read_event(r, rows));
    }
    std::int64_t open = 0;
    for (const auto& r : tx.exec_prepared("im_conv_periods", conv)) {
        PushBatch::Period p{r[0].c_str(), r[1].as<std::int64_t>(), r[2].is_null() ? INT64_MAX : r[2].as<std::int64_t>()};
        if (r[2].is_null()) ++open;
        b.periods.push_back(std::move(p));
    }
    b.full = open <= conv_row_.push_full_max;
    return b;
}

// The fan-out's reads: autocommit (one statement, one snapshot, no
// BEGIN/ROLLBACK round trips).
std::vector<Event> Store::push_events(pqxx::connection_base& c, const std::string& conv, std::int64_t from,
                                      std::int64_t to) {
    prepare_reads(c);
    pqxx::nontransaction tx(c);
    std::vector<Event> out;
    const auto rows = event_rows(tx.exec_prepared("im_push_events", conv, from, to, std::string()), false);
    for (const auto& row : rows.rows) out.push_back(read_event(row, rows));
    return out;
}

Store::Members Store::push_members(pqxx::connection_base& c, const std::string& conv) {
    prepare_reads(c);
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
    prepare_reads(c);
    pqxx::nontransaction tx(c);
    auto r = tx.exec_prepared("im_stale_tokens", text_array(devices), text_array(hashes));
    TokenPairs stale;
    for (const auto& row : r) stale.emplace_back(row[0].c_str(), row[1].c_str());
    return stale;
}

} // namespace im
