// The store's send path (contract section 6: im_send, one statement per
// run or per group of runs), the PostgreSQL bus's publisher, the probes and
// the lab's marks. The other parts of the store live in store_*.cpp
// (store_internal.hpp lists them).
#include "store/store.hpp"

#include "store/db_pool.hpp"
#include "store/lab_schema.hpp"
#include "core/log.hpp"
#include "store/store_internal.hpp"

#include <pqxx/pqxx>

#include <algorithm>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string_view>
#include <utility>

namespace im {

using namespace store_detail;

// ---------------------------------------------------------------- send

Outcome<Store::SendResult> Store::send(pqxx::connection_base& c, const Identity& who, const req::Send& s) {
    auto r = send_run(c, who, {s});
    if (r.empty()) return unavailable("conversation busy, retry with the same request");
    return r.front();
}

namespace {

// Every query of `send`: steps 0-5 of contract section 6 run inside the
// server-side function im_send (schema/functions/im_send.sql), set-based:
// one round trip and a fixed number of statements for a whole group of runs
// (a lone run is a group of one). It first holds the sending devices' rows
// (with the conversations'): a revoked device writes nothing. The lab calls
// its broken variants (lab_schema.hpp) the same way; each function's
// statement is prepared under the function's name.
std::string send_sql(const std::string& function) {
    return "SELECT r_run, r_item, r_code, r_seq, r_mid, r_epoch, r_dup, r_ts, r_atts FROM " + function +
           "($1::text[], $2::text[], $3::text[], $4::text[], $5::integer[], $6::text[], $7::text[], $8::text[], $9::bigint[], "
           "$10::text[], $11::text)";
}

// A held conversation's retry (Store::send_run, lock_wait): im_send behind
// a wait for the row in its lock queue, bounded by $1 ms
// (schema/functions/im_send_queued.sql), in one statement; the lab's
// variants run behind im_send_lock in one transaction with it.
constexpr const char* queued_function = "im_send_queued";
const std::string& queued_sql() {
    static const std::string sql =
        "SELECT r_run, r_item, r_code, r_seq, r_mid, r_epoch, r_dup, r_ts, r_atts FROM im_send_queued($1::integer, "
        "$2::text[], $3::text[], $4::text[], $5::text[], $6::integer[], $7::text[], $8::text[], $9::text[], $10::bigint[], "
        "$11::text[], $12::text)";
    return sql;
}
constexpr const char* lock_function = "im_send_lock";
constexpr const char* lock_sql =
    "SELECT im_send_lock($1::integer, $2::text[], $3::text[], $4::text[], $5::text[])";

// im_send's parameters behind the wait's bound in ms (im_send_queued's);
// `count` of them (im_send_lock takes the first four per-run arrays).
std::vector<std::string> with_wait(std::chrono::milliseconds wait, const std::vector<std::string>& params,
                                   std::size_t count) {
    std::vector<std::string> out{std::to_string(wait.count())};
    out.insert(out.end(), params.begin(), params.begin() + static_cast<std::ptrdiff_t>(count));
    return out;
}

// The wait for a held row ended without the row: its lock_timeout passed
// (55P03), or PostgreSQL broke a deadlock (40P01). Nothing was written;
// the run is held still and tried again (SendScheduler).
bool row_wait_ended(const pqxx::sql_error& e) { return e.sqlstate() == "55P03" || e.sqlstate() == "40P01"; }

// im_send's answer for a run whose conversation row another transaction
// holds: nothing of it was written, the caller runs it again later.
constexpr std::string_view held_code = "LOCKED";

// One result row of im_send as the send's outcome; `at` is the column of
// r_code (r_seq, r_mid, r_epoch, r_dup, r_ts follow it).
Outcome<Store::SendResult> send_outcome(const std::string& conv_id, const pqxx::row& row, int at) {
    const std::string_view code = row[at].c_str();
    if (code == "NOT_MEMBER") return not_member();
    if (code == "MUTED") return muted();
    if (code == "IDEMPOTENCY_MISMATCH") return Error{Code::idempotency_mismatch, "cmid already used with different content"};
    if (code == "ORIGINAL_EXPIRED") return Error{Code::original_expired, "the original was purged by retention"};
    if (code == "PREV_NOT_COMMITTED") return unavailable("the message named by 'prev' is not committed; send it first");
    if (code == "UNAUTHENTICATED") return device_revoked();
    if (code == "NOT_FOUND")
        return Error{Code::not_found, "reply_to names no message you may read, or an attachment no complete upload of yours"};
    if (code != "OK") throw std::runtime_error("im_send: unknown result code " + std::string(code));
    return Store::SendResult{Sent{conv_id, row[at + 1].as<std::int64_t>(), row[at + 2].c_str(), row[at + 4].as<bool>(),
                                  row[at + 3].as<std::int64_t>()},
                             false, row[at + 5].as<std::int64_t>(), row[at + 6].is_null() ? "" : row[at + 6].c_str()};
}

// Items [first, last) of one connection's sends to one conversation.
struct RunSpan {
    const Identity* who;
    std::vector<req::Send>::const_iterator first, last;
};

// im_send's eleven parameters for a group of runs, in the group's order:
// per run device, token hash, conversation, user; per item its run
// (1-based), cmid, body, prev (an empty `prev` is NULL), reply_to (NULL
// when absent), attachments (NULL when none); then the channel
// to notify in the transaction (empty: none, the caller publishes).
std::vector<std::string> send_params(const std::vector<RunSpan>& spans, const std::string& channel) {
    std::vector<std::string> out;
    auto per_run = [&](auto field) {
        return text_array_of(spans.size(), [&](std::size_t g) { return &field(spans[g]); });
    };
    out.push_back(per_run([](const RunSpan& r) -> const std::string& { return r.who->device; }));
    out.push_back(per_run([](const RunSpan& r) -> const std::string& { return r.who->token_sha256; }));
    out.push_back(per_run([](const RunSpan& r) -> const std::string& { return r.first->conv; }));
    out.push_back(per_run([](const RunSpan& r) -> const std::string& { return r.who->user; }));
    std::vector<const req::Send*> items;
    std::string runs = "{";
    for (std::size_t g = 0; g < spans.size(); ++g)
        for (auto it = spans[g].first; it != spans[g].last; ++it) {
            if (!items.empty()) runs += ',';
            runs += std::to_string(g + 1);
            items.push_back(&*it);
        }
    out.push_back(runs + "}");
    auto per_item = [&](std::string req::Send::*field) {
        return text_array_of(items.size(), [&](std::size_t i) -> const std::string* {
            const std::string& v = items[i]->*field;
            return field == &req::Send::prev && v.empty() ? nullptr : &v;
        });
    };
    out.push_back(per_item(&req::Send::cmid));
    out.push_back(per_item(&req::Send::body));
    out.push_back(per_item(&req::Send::prev));
    std::vector<std::string> reply_tos(items.size());
    for (std::size_t i = 0; i < items.size(); ++i)
        if (items[i]->reply_to) reply_tos[i] = std::to_string(*items[i]->reply_to);
    out.push_back(text_array_of(items.size(), [&](std::size_t i) -> const std::string* {
        return items[i]->reply_to ? &reply_tos[i] : nullptr;
    }));
    // attachments: the ids joined by ',' (NULL when none)
    std::vector<std::string> atts(items.size());
    for (std::size_t i = 0; i < items.size(); ++i)
        for (const auto& id : items[i]->attachments) atts[i] += (atts[i].empty() ? "" : ",") + id;
    out.push_back(text_array_of(items.size(), [&](std::size_t i) -> const std::string* {
        return items[i]->attachments.empty() ? nullptr : &atts[i];
    }));
    out.push_back(channel);
    return out;
}

// The rows of one im_send call, per run of `spans`: its outcomes in item
// order, or EMPTY when its conversation's row was held (nothing written).
// Throws when the rows do not answer every item.
std::vector<std::vector<Outcome<Store::SendResult>>> send_results(const pqxx::result& rows,
                                                                  const std::vector<RunSpan>& spans) {
    std::vector<std::vector<Outcome<Store::SendResult>>> out(spans.size());
    std::vector<bool> held(spans.size(), false);
    for (const auto& row : rows) {
        const auto g = static_cast<std::size_t>(row[0].as<int>()) - 1;
        if (g >= spans.size()) throw std::runtime_error("im_send: a result for an unknown run");
        if (std::string_view(row[2].c_str()) == held_code) held[g] = true;
        else out[g].push_back(send_outcome(spans[g].first->conv, row, 2));
    }
    for (std::size_t g = 0; g < spans.size(); ++g) {
        const auto want = static_cast<std::size_t>(spans[g].last - spans[g].first);
        if (held[g]) out[g].clear();
        else if (out[g].size() != want) throw std::runtime_error("im_send: wrong number of results");
    }
    return out;
}

} // namespace

std::vector<Outcome<Store::SendResult>> Store::send_run(pqxx::connection_base& c, const Identity& who,
                                                          const std::vector<req::Send>& batch,
                                                          std::chrono::milliseconds lock_wait) {
    const bool wait = lock_wait.count() > 0;
    using Results = std::vector<Outcome<SendResult>>;
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
                    const std::vector<RunSpan> spans{{&who, batch.begin() + static_cast<std::ptrdiff_t>(from),
                                                      batch.begin() + static_cast<std::ptrdiff_t>(to)}};
                    const auto params = send_params(spans, send_channel_);
                    pqxx::result rows;
                    try {
                        if (faults_.enabled()) {
                            pqxx::work tx(c);
                            if (wait) {
                                c.prepare(lock_function, lock_sql);
                                tx.exec_prepared(lock_function,
                                                 pqxx::prepare::make_dynamic_params(with_wait(lock_wait, params, 4)));
                            }
                            rows = tx.exec_prepared(fn, pqxx::prepare::make_dynamic_params(params));
                            auto fc = faults_.hit("store.before_commit");
                            if (fc == FaultKind::unavailable) return Results(to - from, unavailable("injected fault"));
                            tx.commit();
                            if (fc == FaultKind::drop_reply)
                                for (std::size_t i = from; i < to; ++i) drop[i] = true;
                        } else if (wait) {
                            c.prepare(queued_function, queued_sql());
                            pqxx::nontransaction tx(c); // autocommit: the call is the transaction
                            rows = tx.exec_prepared(queued_function, pqxx::prepare::make_dynamic_params(
                                                                         with_wait(lock_wait, params, params.size())));
                        } else {
                            pqxx::nontransaction tx(c); // autocommit: the call is the transaction
                            rows = tx.exec_prepared(fn, pqxx::prepare::make_dynamic_params(params));
                        }
                    } catch (const pqxx::sql_error& e) {
                        if (!wait || !row_wait_ended(e)) throw;
                        was_held = true; // the row stayed held for the whole wait: try again
                        return Results(to - from, unavailable());
                    }
                    auto part = send_results(rows, spans);
                    if (part[0].empty()) {
                        was_held = true;
                        return Results(to - from, unavailable());
                    }
                    return std::move(part[0]);
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
                log_warn("send_rejected", {{"conv", batch.front().conv}, {"sqlstate", e.sqlstate()}, {"err", e.what()}});
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

std::vector<std::vector<Outcome<Store::SendResult>>> Store::send_group(pqxx::connection_base& c,
                                                                      const std::vector<SendRun>& runs,
                                                                      std::chrono::milliseconds lock_wait) {
    using Results = std::vector<Outcome<SendResult>>;
    const bool wait = lock_wait.count() > 0;
    std::vector<Results> out(runs.size());
    auto one_by_one = [&] {
        for (std::size_t g = 0; g < runs.size(); ++g) out[g] = send_run(c, *runs[g].who, *runs[g].sends, lock_wait);
        return out;
    };
    if (runs.size() == 1 || faults_.enabled()) return one_by_one();
    // The group in conversation order (im_send locks the rows in that order
    // too); runs of one conversation keep their order.
    std::vector<std::size_t> order(runs.size());
    for (std::size_t g = 0; g < order.size(); ++g) order[g] = g;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return runs[a].sends->front().conv < runs[b].sends->front().conv;
    });
    std::vector<RunSpan> spans;
    for (std::size_t k : order) spans.push_back({runs[k].who, runs[k].sends->begin(), runs[k].sends->end()});
    pqxx::result rows;
    try {
        const auto params = send_params(spans, send_channel_);
        pqxx::nontransaction tx(c); // autocommit: the statement is the transaction
        if (wait) {
            c.prepare(queued_function, queued_sql());
            rows = tx.exec_prepared(queued_function,
                                    pqxx::prepare::make_dynamic_params(with_wait(lock_wait, params, params.size())));
        } else {
            c.prepare("im_send", send_sql("im_send"));
            rows = tx.exec_prepared("im_send", pqxx::prepare::make_dynamic_params(params));
        }
    } catch (const pqxx::unique_violation&) {
        return one_by_one(); // as send_run: its second pass answers the key as a duplicate
    } catch (const pqxx::sql_error& e) {
        if (wait && row_wait_ended(e)) return out; // every run held still (EMPTY): tried again
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
    try {
        auto part = send_results(rows, spans);
        // A held run stays EMPTY: run it again later (Store::send_group, header).
        for (std::size_t k = 0; k < order.size(); ++k) out[order[k]] = std::move(part[k]);
    } catch (const std::exception& e) { // committed, but unreadable: the resends are dups
        log_warn("db_error", {{"op", "send_group_result"}, {"err", e.what()}});
        for (std::size_t g = 0; g < runs.size(); ++g) out[g] = Results(runs[g].sends->size(), unavailable());
    }
    return out;
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
