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
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

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
// A group whose runs carry edits or reacts (contract section 12): the
// items in order, sends through im_send and changes through im_change, in
// one statement (schema/functions/im_change.sql, im_write_group); $1 the
// lock wait in ms (0: none, skip held rows).
constexpr const char* write_group_function = "im_write_group";
constexpr const char* write_group_sql =
    "SELECT r_run, r_item, r_code, r_seq, r_mid, r_epoch, r_dup, r_ts, r_atts, r_changed FROM im_write_group("
    "$1::integer, $2::text[], $3::text[], $4::text[], $5::text[], $6::integer[], $7::text[], $8::text[], $9::text[], "
    "$10::text[], $11::bigint[], $12::text[], $13::bigint[], $14::text[], $15::boolean[], $16::text)";
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

// One connection's items to one conversation, in order: sends only (the
// im_send path) or writes (im_write_group, when a run carries changes).
template <class Item>
struct RunSpan {
    const Identity* who;
    const std::string* conv;
    std::vector<const Item*> items;
};
using SendSpan = RunSpan<req::Send>;
using WriteSpan = RunSpan<req::Write>;

// A write's fields as im_write_group's columns take them (NULL: not this kind's).
const std::string* cmid_of(const req::Send& s) { return &s.cmid; }
const std::string* cmid_of(const req::Write& w) {
    return std::visit([](const auto& r) { return &r.cmid; }, w);
}
const req::Send* send_of(const req::Send& s) { return &s; }
const req::Send* send_of(const req::Write& w) { return std::get_if<req::Send>(&w); }
const std::string* body_of(const req::Send& s) { return &s.body; }
const std::string* body_of(const req::Write& w) {
    if (const auto* s = std::get_if<req::Send>(&w)) return &s->body;
    if (const auto* e = std::get_if<req::Edit>(&w)) return &e->body;
    return nullptr;
}

// The parameters of im_send, or of im_write_group (Item = req::Write;
// after its lock wait, which the caller puts first), for a group of runs in
// the group's order: per run device, token hash, conversation, user; per
// item its run (1-based), (im_write_group) its kind, cmid, body (a send's
// or an edit's), prev (an empty `prev` is NULL), reply_to (NULL when
// absent), attachments (the ids joined by ',', NULL when none),
// (im_write_group) target, emoji, on (NULL for a send); then the channel to
// notify in the transaction (empty: none, the caller publishes).
template <class Item>
std::vector<std::string> group_params(const std::vector<RunSpan<Item>>& spans, const std::string& channel) {
    constexpr bool writes = std::is_same_v<Item, req::Write>;
    std::vector<std::string> out;
    auto per_run = [&](auto field) {
        return text_array_of(spans.size(), [&](std::size_t g) { return &field(spans[g]); });
    };
    out.push_back(per_run([](const RunSpan<Item>& r) -> const std::string& { return r.who->device; }));
    out.push_back(per_run([](const RunSpan<Item>& r) -> const std::string& { return r.who->token_sha256; }));
    out.push_back(per_run([](const RunSpan<Item>& r) -> const std::string& { return *r.conv; }));
    out.push_back(per_run([](const RunSpan<Item>& r) -> const std::string& { return r.who->user; }));
    std::vector<const Item*> items;
    std::string runs = "{";
    for (std::size_t g = 0; g < spans.size(); ++g)
        for (const Item* it : spans[g].items) {
            if (!items.empty()) runs += ',';
            runs += std::to_string(g + 1);
            items.push_back(it);
        }
    out.push_back(runs + "}");
    const std::size_t n = items.size();
    std::vector<std::string> scratch(n);
    // One per-item column; `get` may use its item's scratch string.
    auto column = [&](auto get) {
        return text_array_of(n, [&](std::size_t i) -> const std::string* { return get(*items[i], scratch[i]); });
    };
    if constexpr (writes) {
        static const std::string kinds[] = {"msg", "edit", "reaction"}; // req::Write's alternatives
        out.push_back(column([](const req::Write& w, std::string&) { return &kinds[w.index()]; }));
    }
    out.push_back(column([](const Item& it, std::string&) { return cmid_of(it); }));
    out.push_back(column([](const Item& it, std::string&) { return body_of(it); }));
    out.push_back(column([](const Item& it, std::string&) -> const std::string* {
        const auto* s = send_of(it);
        return s && !s->prev.empty() ? &s->prev : nullptr;
    }));
    out.push_back(column([](const Item& it, std::string& tmp) -> const std::string* {
        const auto* s = send_of(it);
        if (!s || !s->reply_to) return nullptr;
        tmp = std::to_string(*s->reply_to);
        return &tmp;
    }));
    out.push_back(column([](const Item& it, std::string& tmp) -> const std::string* {
        const auto* s = send_of(it);
        if (!s || s->attachments.empty()) return nullptr;
        tmp.clear();
        for (const auto& id : s->attachments) tmp += (tmp.empty() ? "" : ",") + id;
        return &tmp;
    }));
    if constexpr (writes) {
        auto target = [](const req::Write& w) -> std::optional<std::int64_t> {
            if (const auto* e = std::get_if<req::Edit>(&w)) return e->target;
            if (const auto* r = std::get_if<req::React>(&w)) return r->target;
            return std::nullopt;
        };
        out.push_back(column([&](const req::Write& w, std::string& tmp) -> const std::string* {
            const auto t = target(w);
            if (!t) return nullptr;
            tmp = std::to_string(*t);
            return &tmp;
        }));
        out.push_back(column([](const req::Write& w, std::string&) -> const std::string* {
            const auto* r = std::get_if<req::React>(&w);
            return r ? &r->emoji : nullptr;
        }));
        out.push_back(column([](const req::Write& w, std::string& tmp) -> const std::string* {
            const auto* r = std::get_if<req::React>(&w);
            if (!r) return nullptr;
            tmp = r->on ? "t" : "f";
            return &tmp;
        }));
    }
    out.push_back(channel);
    return out;
}

// The rows of one im_send or im_write_group call, per run of `spans`: its
// outcomes in item order, or EMPTY when its conversation's row was held
// (nothing written). Throws when the rows do not answer every item.
template <class Item>
std::vector<std::vector<Outcome<Store::SendResult>>> group_results(const pqxx::result& rows,
                                                                   const std::vector<RunSpan<Item>>& spans) {
    std::vector<std::vector<Outcome<Store::SendResult>>> out(spans.size());
    std::vector<bool> held(spans.size(), false);
    for (const auto& row : rows) {
        const auto g = static_cast<std::size_t>(row[0].as<int>()) - 1;
        if (g >= spans.size()) throw std::runtime_error("im_send: a result for an unknown run");
        if (std::string_view(row[2].c_str()) == held_code) {
            held[g] = true;
            continue;
        }
        const auto at = out[g].size();
        if (at >= spans[g].items.size()) throw std::runtime_error("im_send: too many results");
        if (send_of(*spans[g].items[at])) out[g].push_back(send_outcome(*spans[g].conv, row, 2));
        else out[g].push_back(change_outcome(*spans[g].conv, row[2], row[3], row[6], row[9], row[5]));
    }
    for (std::size_t g = 0; g < spans.size(); ++g) {
        if (held[g]) out[g].clear();
        else if (out[g].size() != spans[g].items.size()) throw std::runtime_error("im_send: wrong number of results");
    }
    return out;
}

} // namespace

std::vector<Outcome<Store::SendResult>> Store::send_run(pqxx::connection_base& c, const Identity& who,
                                                          const std::vector<req::Send>& sends,
                                                          std::chrono::milliseconds lock_wait) {
    std::vector<const req::Send*> batch;
    batch.reserve(sends.size());
    for (const auto& s : sends) batch.push_back(&s);
    return send_items(c, who, batch, lock_wait);
}

std::vector<Outcome<Store::SendResult>> Store::send_items(pqxx::connection_base& c, const Identity& who,
                                                            const std::vector<const req::Send*>& batch,
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
                    std::vector<SendSpan> spans{{&who, &batch.front()->conv, {}}};
                    for (std::size_t i = from; i < to; ++i) spans[0].items.push_back(batch[i]);
                    const auto params = group_params(spans, send_channel_);
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
                    auto part = group_results(rows, spans);
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
                log_warn("send_rejected", {{"conv", batch.front()->conv}, {"sqlstate", e.sqlstate()}, {"err", e.what()}});
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

std::vector<Outcome<Store::SendResult>> Store::write_run_one_by_one(pqxx::connection_base& c, const Identity& who,
                                                                  const std::vector<req::Write>& items,
                                                                  std::chrono::milliseconds lock_wait) {
    return write_in_order(
        items, [&](const std::vector<req::Send>& sends) { return send_run(c, who, sends, lock_wait); },
        [&](const req::Edit& e) { return edit(c, who, e); }, [&](const req::React& r) { return react(c, who, r); });
}

std::vector<std::vector<Outcome<Store::SendResult>>> Store::send_group(pqxx::connection_base& c,
                                                                      const std::vector<SendRun>& runs,
                                                                      std::chrono::milliseconds lock_wait) {
    using Results = std::vector<Outcome<SendResult>>;
    const bool wait = lock_wait.count() > 0;
    std::vector<Results> out(runs.size());
    bool changes = false; // an edit or react rides the group: im_write_group
    for (const auto& r : runs)
        for (const auto& it : *r.items) changes = changes || !std::holds_alternative<req::Send>(it);
    auto sends_of = [](const std::vector<req::Write>& items) {
        std::vector<const req::Send*> sends;
        sends.reserve(items.size());
        for (const auto& it : items) sends.push_back(&std::get<req::Send>(it));
        return sends;
    };
    auto one_by_one = [&] {
        for (std::size_t g = 0; g < runs.size(); ++g)
            out[g] = changes ? write_run_one_by_one(c, *runs[g].who, *runs[g].items, lock_wait)
                             : send_items(c, *runs[g].who, sends_of(*runs[g].items), lock_wait);
        return out;
    };
    if (faults_.enabled() || (runs.size() == 1 && !changes)) return one_by_one();
    // The group in conversation order (the rows are locked in that order
    // too); runs of one conversation keep their order.
    std::vector<std::size_t> order(runs.size());
    for (std::size_t g = 0; g < order.size(); ++g) order[g] = g;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return write_conv(runs[a].items->front()) < write_conv(runs[b].items->front());
    });
    std::vector<SendSpan> send_spans;
    std::vector<WriteSpan> write_spans;
    for (std::size_t k : order) {
        const auto& items = *runs[k].items;
        if (changes) {
            write_spans.push_back({runs[k].who, &write_conv(items.front()), {}});
            for (const auto& it : items) write_spans.back().items.push_back(&it);
        } else {
            send_spans.push_back({runs[k].who, &write_conv(items.front()), {}});
            for (const auto& it : items) send_spans.back().items.push_back(&std::get<req::Send>(it));
        }
    }
    auto all = [&](const Outcome<SendResult>& o) {
        for (std::size_t g = 0; g < runs.size(); ++g) out[g] = Results(runs[g].items->size(), o);
        return out;
    };
    pqxx::result rows;
    try {
        pqxx::nontransaction tx(c); // autocommit: the statement is the transaction
        if (changes) {
            auto params = group_params(write_spans, send_channel_);
            params.insert(params.begin(), std::to_string(wait ? lock_wait.count() : 0));
            c.prepare(write_group_function, write_group_sql);
            rows = tx.exec_prepared(write_group_function, pqxx::prepare::make_dynamic_params(params));
        } else if (wait) {
            const auto params = group_params(send_spans, send_channel_);
            c.prepare(queued_function, queued_sql());
            rows = tx.exec_prepared(queued_function,
                                    pqxx::prepare::make_dynamic_params(with_wait(lock_wait, params, params.size())));
        } else {
            const auto params = group_params(send_spans, send_channel_);
            c.prepare("im_send", send_sql("im_send"));
            rows = tx.exec_prepared("im_send", pqxx::prepare::make_dynamic_params(params));
        }
    } catch (const pqxx::unique_violation&) {
        return one_by_one(); // as send_run: its second pass answers the key as a duplicate
    } catch (const pqxx::sql_error& e) {
        if (wait && row_wait_ended(e)) return out; // every run held still (EMPTY): tried again
        if (!deterministic(e)) {
            log_warn("db_error", {{"op", "send_group"}, {"sqlstate", e.sqlstate()}, {"err", e.what()}});
            return all(unavailable());
        }
        return one_by_one(); // nothing committed: each run alone, each item alone within it
    } catch (const pqxx::in_doubt_error& e) {
        log_warn("db_in_doubt", {{"op", "send_group"}, {"err", e.what()}});
        return all(unavailable("commit outcome unknown; retry with the same request"));
    } catch (const std::exception& e) {
        log_warn("db_error", {{"op", "send_group"}, {"err", e.what()}});
        return all(unavailable());
    }
    try {
        auto part = changes ? group_results(rows, write_spans) : group_results(rows, send_spans);
        // A held run stays EMPTY: run it again later (Store::send_group, header).
        for (std::size_t k = 0; k < order.size(); ++k) out[order[k]] = std::move(part[k]);
        if (changes && notifies_in_commit())
            for (auto& run : out)
                for (auto& o : run)
                    if (o) o->notified = true;
    } catch (const std::exception& e) { // committed, but unreadable: the resends are dups
        log_warn("db_error", {{"op", "send_group_result"}, {"err", e.what()}});
        return all(unavailable());
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
