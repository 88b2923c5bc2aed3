// The SQL of webhooks (store_webhooks.hpp; docs/operations.md, "Webhooks").
#include "store/store_webhooks.hpp"

#include "core/strings.hpp"
#include "store/store.hpp"
#include "store/store_internal.hpp"

#include <openssl/rand.h>

#include <algorithm>
#include <stdexcept>

namespace im::webhooks {

namespace {

std::string random_hex(std::size_t bytes) {
    std::vector<unsigned char> b(bytes);
    if (RAND_bytes(b.data(), static_cast<int>(b.size())) != 1) throw std::runtime_error("RAND_bytes failed");
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (unsigned char x : b) {
        out += digits[x >> 4];
        out += digits[x & 15];
    }
    return out;
}

std::optional<std::string> opt(const pqxx::field& f) {
    if (f.is_null()) return std::nullopt;
    return f.as<std::string>();
}

// A text[] literal ("{\"a\",\"b\"}"): libpqxx 6 binds no arrays.
std::string text_array(const std::vector<std::string>& v) {
    std::string out = "{";
    for (const auto& x : v) {
        if (out.size() > 1) out += ',';
        out += '"';
        for (char ch : x) {
            if (ch == '"' || ch == '\\') out += '\\';
            out += ch;
        }
        out += '"';
    }
    return out + "}";
}

std::string bigint_array(const std::vector<std::int64_t>& v) {
    std::string out = "{";
    for (auto x : v) out += (out.size() > 1 ? "," : "") + std::to_string(x);
    return out + "}";
}

void need_webhook(pqxx::transaction_base& tx, const std::string& id) {
    if (tx.exec_params("SELECT 1 FROM webhooks WHERE webhook_id = $1", id).empty())
        throw AdminError(AdminError::not_found, "no such webhook: " + id);
}

} // namespace

const std::vector<std::string>& all_kinds() {
    static const std::vector<std::string> k = {"msg", "edit", "recall", "reaction", "join", "leave"};
    return k;
}

std::pair<std::string, std::string> add(pqxx::connection_base& c, const std::string& url,
                                        const std::vector<std::string>& kinds, const std::string& secret) {
    if (!(url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0) || url.size() > 2048 ||
        url.find_first_of(" \t\r\n") != std::string::npos)
        throw AdminError(AdminError::invalid, "url must be an http:// or https:// URL of at most 2048 characters");
    std::vector<std::string> ks = kinds.empty() ? all_kinds() : kinds;
    std::sort(ks.begin(), ks.end());
    ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
    std::string arr = "{";
    for (const auto& k : ks) {
        if (std::find(all_kinds().begin(), all_kinds().end(), k) == all_kinds().end())
            throw AdminError(AdminError::invalid, "unknown event kind '" + k + "' (msg, edit, recall, reaction, join, leave)");
        arr += (arr.size() > 1 ? "," : "") + k;
    }
    arr += "}";
    if (!secret.empty() && (secret.size() < 16 || secret.size() > 256))
        throw AdminError(AdminError::invalid, "secret must be 16-256 characters");
    const std::string sec = secret.empty() ? random_hex(32) : secret;
    const std::string id = "wh_" + random_hex(8);
    pqxx::work tx(c);
    tx.exec_params("INSERT INTO webhooks (webhook_id, url, kinds, secret) VALUES ($1, $2, $3::text[], $4)", id, url, arr,
                   sec);
    // Every conversation's cursor at its head now: only later events go out.
    tx.exec_params("INSERT INTO webhook_cursors (webhook_id, conv_id, done_seq) "
                   "SELECT $1, conv_id, next_seq - 1 FROM conversations",
                   id);
    tx.commit();
    return {id, sec};
}

bool remove(pqxx::connection_base& c, const std::string& id) {
    pqxx::work tx(c);
    auto r = tx.exec_params("DELETE FROM webhooks WHERE webhook_id = $1", id);
    tx.commit();
    return r.affected_rows() > 0;
}

std::vector<Webhook> list(pqxx::connection_base& c) {
    pqxx::read_transaction tx(c);
    auto r = tx.exec(
        "SELECT w.webhook_id, w.url, array_to_string(w.kinds, ','), w.secret, "
        "to_char(w.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), "
        "coalesce((SELECT sum(greatest(cv.next_seq - 1 - wc.done_seq, 0)) FROM webhook_cursors wc "
        "          JOIN conversations cv ON cv.conv_id = wc.conv_id WHERE wc.webhook_id = w.webhook_id), 0)::bigint "
        "+ coalesce((SELECT sum(cv.next_seq - 1) FROM conversations cv WHERE NOT EXISTS "
        "          (SELECT 1 FROM webhook_cursors wc WHERE wc.webhook_id = w.webhook_id AND wc.conv_id = cv.conv_id)), 0)::bigint, "
        "(SELECT count(*) FROM webhook_failures f WHERE f.webhook_id = w.webhook_id), "
        "coalesce(w.last_error, (SELECT wc.last_error FROM webhook_cursors wc WHERE wc.webhook_id = w.webhook_id "
        "          AND wc.last_error IS NOT NULL LIMIT 1)), "
        "to_char(w.last_error_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), "
        "to_char(w.last_success_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') "
        "FROM webhooks w ORDER BY w.created_at, w.webhook_id");
    std::vector<Webhook> out;
    for (const auto& row : r) {
        Webhook w;
        w.id = row[0].as<std::string>();
        w.url = row[1].as<std::string>();
        w.kinds = split_commas(row[2].as<std::string>());
        w.secret = row[3].as<std::string>();
        w.created = row[4].as<std::string>();
        w.backlog = row[5].as<std::int64_t>();
        w.failed = row[6].as<std::int64_t>();
        w.last_error = opt(row[7]);
        w.last_error_at = opt(row[8]);
        w.last_success_at = opt(row[9]);
        out.push_back(std::move(w));
    }
    return out;
}

void replay(pqxx::connection_base& c, const std::string& id, const std::string& conv, std::int64_t from_seq) {
    if (from_seq < 1) throw AdminError(AdminError::invalid, "from_seq must be >= 1");
    pqxx::work tx(c);
    need_webhook(tx, id);
    if (tx.exec_params("SELECT 1 FROM conversations WHERE conv_id = $1", conv).empty())
        throw AdminError(AdminError::not_found, "no such conversation: " + conv);
    // lease_seq moves on: an attempt in flight no longer writes its outcome.
    tx.exec_params("INSERT INTO webhook_cursors (webhook_id, conv_id, done_seq) VALUES ($1, $2, $3) "
                   "ON CONFLICT (webhook_id, conv_id) DO UPDATE SET done_seq = EXCLUDED.done_seq, "
                   "lease_owner = NULL, lease_until = NULL, lease_seq = webhook_cursors.lease_seq + 1, attempts = 0, "
                   "retry_at = '-infinity', failing_since = NULL, last_error = NULL",
                   id, conv, from_seq - 1);
    tx.exec_params("DELETE FROM webhook_failures WHERE webhook_id = $1 AND conv_id = $2 AND to_seq >= $3", id, conv,
                   from_seq);
    tx.commit();
}

std::vector<Failure> failures(pqxx::connection_base& c, const std::string& id, std::int64_t limit) {
    pqxx::read_transaction tx(c);
    need_webhook(tx, id);
    auto r = tx.exec_params("SELECT conv_id, from_seq, to_seq, attempts, coalesce(last_error, ''), "
                            "to_char(failed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') "
                            "FROM webhook_failures WHERE webhook_id = $1 ORDER BY failed_at, conv_id, from_seq LIMIT $2",
                            id, limit);
    std::vector<Failure> out;
    for (const auto& row : r)
        out.push_back({row[0].as<std::string>(), row[5].as<std::string>(), row[1].as<std::int64_t>(),
                       row[2].as<std::int64_t>(), row[3].as<std::int64_t>(), row[4].as<std::string>()});
    return out;
}

// ---------------------------------------------------------------- the deliverer

std::int64_t discover(pqxx::connection_base& c, const std::string& id) {
    pqxx::nontransaction tx(c);
    auto r = tx.exec_params("INSERT INTO webhook_cursors (webhook_id, conv_id, done_seq) "
                            "SELECT w.webhook_id, cv.conv_id, 0 FROM webhooks w CROSS JOIN conversations cv "
                            "WHERE w.webhook_id = $1 AND NOT EXISTS (SELECT 1 FROM webhook_cursors wc "
                            "  WHERE wc.webhook_id = $1 AND wc.conv_id = cv.conv_id) "
                            "ON CONFLICT DO NOTHING",
                            id);
    return static_cast<std::int64_t>(r.affected_rows());
}

namespace {

// The claim's statement (claim_pages). `hinted`: the candidates are only the
// conversations named in $7 (with the head each was announced at, $8), found
// by primary-key probes, and the statement also answers which of those are
// already delivered past that head ("settled"); otherwise (a sweep) every
// cursor of the webhook is a candidate.
std::string claim_sql(bool hinted) {
    // cand: claim's candidates (locked, SKIP LOCKED), each with the first
    // seq it has to deliver (lo: past the cursor and any purge) and its head;
    // alloc: in the claim's order, each gets what it has up to what is left
    // of max_events (a running sum of the ones before it); leased: those
    // that got any (or whose undelivered events were all purged) leased;
    // then their events in [lo, upto] with what a page shows of their later
    // changes (the backend's view: every event, no `me`), and one row with
    // NULL events for a conversation that has none. One statement: one
    // snapshot, so the heads, min_seqs and events agree (seqs are gap-free
    // at and above min_seq). n is cast back to bigint (sum() gives numeric):
    // a numeric bound on seq would make the range a filter over all of the
    // conversation's events instead of a range scan of the primary key. The
    // events' subquery has a LIMIT (the range's length) so that it stays a
    // lateral range scan per leased conversation: without it the planner may
    // flatten it into a hash join over a sequential scan of all events (seen
    // in the custom plans of a live bench: every claim read the whole table).
    // The lease's UPDATE finds its rows by the ctid the candidates' lock
    // returned (a TID scan: joined by conv_id, the generic plan read every
    // cursor of the webhook once per leased conversation); a row whose ctid
    // moved on is simply not leased this time (its events are not read).
    const std::string from = hinted
        ? "FROM unnest($7::text[], $8::bigint[]) AS h(conv_id, hi) "
          "  JOIN webhook_cursors wc ON wc.webhook_id = $1 AND wc.conv_id = h.conv_id "
          "  JOIN conversations cv ON cv.conv_id = wc.conv_id "
          "  WHERE "
        : "FROM webhook_cursors wc JOIN conversations cv ON cv.conv_id = wc.conv_id WHERE wc.webhook_id = $1 AND ";
    std::string sql =
        "WITH cand AS (SELECT wc.ctid AS tid, wc.conv_id, wc.retry_at, greatest(wc.done_seq + 1, cv.min_seq) AS lo, "
        "    cv.next_seq - 1 AS head " + from +
        "  cv.next_seq - 1 > wc.done_seq AND wc.retry_at <= now() "
        "    AND (wc.lease_until IS NULL OR wc.lease_until < now()) "
        "  ORDER BY wc.retry_at, wc.conv_id LIMIT $4 FOR UPDATE OF wc SKIP LOCKED), "
        "alloc AS (SELECT tid, conv_id, lo, head, greatest(least(head - lo + 1, $6 - coalesce(sum(greatest(head - lo + 1, 0)) "
        "    OVER (ORDER BY retry_at, conv_id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)), 0)::bigint AS n "
        "  FROM cand), "
        "leased AS (UPDATE webhook_cursors wc SET lease_owner = $2, lease_until = now() + $3 * interval '1 millisecond', "
        "    lease_seq = wc.lease_seq + 1 "
        "  FROM alloc a WHERE wc.ctid = a.tid AND wc.webhook_id = $1 AND wc.conv_id = a.conv_id AND (a.n > 0 OR a.lo > a.head) "
        "  RETURNING wc.conv_id, wc.done_seq, wc.lease_seq, wc.attempts, "
        "    coalesce(wc.failing_since <= now() - $5 * interval '1 millisecond', false) AS give_up, a.head, a.lo, "
        "    CASE WHEN a.n > 0 THEN a.lo + a.n - 1 ELSE a.head END AS upto), ";
    if (hinted)
        sql += "rows AS (SELECT *, false AS settled FROM leased UNION ALL "
               "  SELECT h.conv_id, wc.done_seq, 0, 0, false, 0, 1, 0, true "
               "  FROM unnest($7::text[], $8::bigint[]) AS h(conv_id, hi) "
               "  JOIN webhook_cursors wc ON wc.webhook_id = $1 AND wc.conv_id = h.conv_id "
               "  WHERE wc.done_seq >= h.hi AND NOT EXISTS (SELECT 1 FROM leased l WHERE l.conv_id = h.conv_id)) ";
    else
        sql += "rows AS (SELECT *, false AS settled FROM leased) ";
    sql += "SELECT e.*, x.edit_seq, x.edit_body, floor(extract(epoch from x.edit_at) * 1000)::bigint, x.reactions_seq, "
           "  e.kind = 'msg' AND EXISTS (SELECT 1 FROM events r WHERE r.conv_id = e.conv_id AND r.kind = 'recall' "
           "    AND r.target_seq = e.seq), x.reactions_top, NULL::text, "
           "  l.conv_id, l.done_seq, l.lease_seq, l.attempts, l.give_up, l.head, l.upto, l.lo, l.settled "
           "FROM rows l LEFT JOIN LATERAL (SELECT " + store_detail::event_columns() +
           "  FROM events WHERE conv_id = l.conv_id AND seq >= l.lo AND seq <= l.upto "
           "  ORDER BY seq LIMIT greatest(l.upto - l.lo + 1, 0)) e ON true "
           "LEFT JOIN msg_changes x ON e.kind = 'msg' AND x.conv_id = e.conv_id AND x.seq = e.seq "
           "ORDER BY l.conv_id, e.seq";
    return sql;
}

} // namespace

ClaimedBatch claim_pages(pqxx::connection_base& c, const std::string& id, const std::string& owner,
                         std::int64_t lease_ms, std::int64_t max_events, std::int64_t give_up_ms,
                         const std::vector<std::pair<std::string, std::int64_t>>* hints) {
    // Prepared on the worker's session (planning this statement from scratch
    // took ~20 ms of PostgreSQL's CPU per claim on a loaded machine; a
    // prepared statement is planned generically after its fifth run).
    static const std::string sweep_sql = claim_sql(false), hinted_sql = claim_sql(true);
    pqxx::result r;
    if (hints) {
        std::vector<std::string> hconv;
        std::vector<std::int64_t> hhi;
        for (const auto& [conv, hi] : *hints) {
            hconv.push_back(conv);
            hhi.push_back(hi);
        }
        c.prepare("im_webhook_claim_hinted", hinted_sql);
        pqxx::nontransaction tx(c); // one statement: its own transaction
        r = tx.exec_prepared("im_webhook_claim_hinted", id, owner, lease_ms, max_events, give_up_ms, max_events,
                             text_array(hconv), bigint_array(hhi));
    } else {
        c.prepare("im_webhook_claim_pages", sweep_sql);
        pqxx::nontransaction tx(c);
        r = tx.exec_prepared("im_webhook_claim_pages", id, owner, lease_ms, max_events, give_up_ms, max_events);
    }
    ClaimedBatch out;
    std::int64_t allotted = 0;
    std::vector<std::int64_t> los;
    for (const auto& row : r) {
        const std::string conv = row[23].c_str();
        if (row[31].as<bool>()) { // a hinted conversation already delivered past its hint
            out.settled.push_back({conv, row[24].as<std::int64_t>()});
            continue;
        }
        if (out.convs.empty() || out.convs.back().lease.conv != conv) {
            Claimed cl;
            cl.lease = {conv, row[24].as<std::int64_t>(), row[25].as<std::int64_t>(), row[26].as<std::int64_t>(),
                        row[27].as<bool>()};
            cl.head = row[28].as<std::int64_t>();
            cl.upto = row[29].as<std::int64_t>();
            los.push_back(row[30].as<std::int64_t>());
            out.convs.push_back(std::move(cl));
        }
        if (row[1].is_null()) continue; // no events: all of them purged
        out.convs.back().events.push_back(store_detail::read_event(row));
        ++allotted;
    }
    for (std::size_t i = 0; i < out.convs.size(); ++i) {
        // [lo, upto] is gap-free: anything else is a page this batch must not
        // vouch for; it delivers nothing of that conversation, whose cursor
        // stays (read again next time, never skipped).
        auto& cl = out.convs[i];
        const std::int64_t want = cl.upto >= los[i] ? cl.upto - los[i] + 1 : 0;
        if (static_cast<std::int64_t>(cl.events.size()) != want ||
            (want > 0 && (cl.events.front().seq != los[i] || cl.events.back().seq != cl.upto))) {
            cl.events.clear();
            cl.upto = cl.lease.done_seq;
        }
        if (!cl.caught_up()) out.full = true;
    }
    if (allotted >= max_events) out.full = true;
    return out;
}

std::int64_t finish_batch(pqxx::connection_base& c, const std::string& id,
                          const std::vector<std::pair<Lease, std::int64_t>>& done, const std::vector<Lease>& unread,
                          bool success, const std::vector<bool>& caught_up, std::int64_t linger_ms) {
    std::vector<std::string> dconv, uconv;
    std::vector<std::int64_t> dlease, dupto, ulease, dlinger;
    for (const auto& [l, upto] : done) {
        dlinger.push_back(dconv.size() < caught_up.size() && caught_up[dconv.size()] ? linger_ms : 0);
        dconv.push_back(l.conv);
        dlease.push_back(l.lease_seq);
        dupto.push_back(upto);
    }
    for (const auto& l : unread) {
        uconv.push_back(l.conv);
        ulease.push_back(l.lease_seq);
    }
    // One statement: its own transaction. Only the rows named (by conv and
    // lease_seq) move; a delivered conversation's retry_at becomes now (plus
    // linger_ms when its page reached the head: not claimed before), and the
    // next claims (ordered by retry_at) take the longest-waiting ones first.
    pqxx::nontransaction tx(c);
    auto r = tx.exec_params(
        "WITH d AS (SELECT * FROM unnest($2::text[], $3::bigint[], $4::bigint[], $8::bigint[]) "
        "  AS d(conv_id, lease_seq, upto, linger)), "
        "moved AS (UPDATE webhook_cursors wc SET done_seq = greatest(wc.done_seq, d.upto), lease_owner = NULL, "
        "  lease_until = NULL, attempts = 0, "
        "  retry_at = now() + d.linger * interval '1 millisecond', failing_since = NULL, last_error = NULL "
        "  FROM d WHERE wc.webhook_id = $1 AND wc.conv_id = d.conv_id AND wc.lease_seq = d.lease_seq RETURNING 1), "
        "freed AS (UPDATE webhook_cursors wc SET lease_owner = NULL, lease_until = NULL "
        "  FROM unnest($5::text[], $6::bigint[]) AS u(conv_id, lease_seq) "
        "  WHERE wc.webhook_id = $1 AND wc.conv_id = u.conv_id AND wc.lease_seq = u.lease_seq RETURNING 1), "
        "ok AS (UPDATE webhooks SET last_success_at = now() WHERE webhook_id = $1 AND $7 RETURNING 1) "
        "SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM freed), (SELECT count(*) FROM ok)",
        id, text_array(dconv), bigint_array(dlease), bigint_array(dupto), text_array(uconv), bigint_array(ulease),
        success, bigint_array(dlinger));
    return static_cast<std::int64_t>(done.size()) - r[0][0].as<std::int64_t>();
}

void attempt_failed(pqxx::connection_base& c, const std::string& id, const Lease& l, std::int64_t to_seq,
                    std::int64_t retry_ms, const std::string& error) {
    const std::string err = error.substr(0, 500);
    pqxx::work tx(c);
    if (l.give_up) {
        auto r = tx.exec_params("UPDATE webhook_cursors SET done_seq = greatest(done_seq, $4), lease_owner = NULL, "
                                "lease_until = NULL, attempts = 0, retry_at = '-infinity', failing_since = NULL, "
                                "last_error = $5 WHERE webhook_id = $1 AND conv_id = $2 AND lease_seq = $3",
                                id, l.conv, l.lease_seq, to_seq, err);
        if (r.affected_rows() > 0)
            tx.exec_params("INSERT INTO webhook_failures (webhook_id, conv_id, from_seq, to_seq, attempts, last_error) "
                           "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (webhook_id, conv_id, from_seq) DO UPDATE "
                           "SET to_seq = greatest(webhook_failures.to_seq, EXCLUDED.to_seq), attempts = EXCLUDED.attempts, "
                           "last_error = EXCLUDED.last_error, failed_at = now()",
                           id, l.conv, l.done_seq + 1, to_seq, l.attempts + 1, err);
    } else {
        tx.exec_params("UPDATE webhook_cursors SET lease_owner = NULL, lease_until = NULL, attempts = attempts + 1, "
                       "retry_at = now() + $4 * interval '1 millisecond', failing_since = coalesce(failing_since, now()), "
                       "last_error = $5 WHERE webhook_id = $1 AND conv_id = $2 AND lease_seq = $3",
                       id, l.conv, l.lease_seq, retry_ms, err);
    }
    tx.exec_params("UPDATE webhooks SET last_error = $2, last_error_at = now() WHERE webhook_id = $1", id, err);
    tx.commit();
}

std::vector<Backlog> backlogs(pqxx::connection_base& c) {
    pqxx::nontransaction tx(c);
    auto r = tx.exec(
        "SELECT w.webhook_id, coalesce(sum(greatest(cv.next_seq - 1 - wc.done_seq, 0)), 0)::bigint, "
        "  coalesce(extract(epoch from now() - min((SELECT e.created_at FROM events e WHERE e.conv_id = wc.conv_id "
        "      AND e.seq > wc.done_seq ORDER BY e.seq LIMIT 1)) FILTER (WHERE cv.next_seq - 1 > wc.done_seq)), 0)::float8 "
        "FROM webhooks w LEFT JOIN webhook_cursors wc ON wc.webhook_id = w.webhook_id "
        "LEFT JOIN conversations cv ON cv.conv_id = wc.conv_id GROUP BY w.webhook_id ORDER BY w.webhook_id");
    std::vector<Backlog> out;
    for (const auto& row : r) out.push_back({row[0].as<std::string>(), row[1].as<std::int64_t>(), row[2].as<double>()});
    return out;
}

} // namespace im::webhooks
