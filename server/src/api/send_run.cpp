// A run's path after its database call (send_scheduler.hpp): the replies,
// the own subscribers, the bus. Apart from the scheduler so it needs no
// pool: the stateful fuzz target (tests/fuzz/fuzz_session.cpp) runs it
// against an in-memory SessionStore.
#include "api/send_scheduler.hpp"

#include "core/metrics.hpp"

#include <chrono>
#include <future>

namespace im {

namespace {

Handled send_reply(ApiContext& ctx, const Outcome<Store::SendResult>& o, const std::optional<std::string>& rid) {
    if (!o) return error_reply(o.error(), rid);
    // The commit is durable now; this point tests replies lost after it.
    auto f = ctx.faults.hit("api.after_send_commit");
    if (f == FaultKind::unavailable) return error_reply(unavailable("injected fault"), rid);
    Handled h;
    if (o->drop_reply || f == FaultKind::drop_reply) h.code = "DROPPED";
    else h.frame = encode_reply(o->sent, rid);
    return h;
}

} // namespace

void send_run_async(ApiContext& ctx, SessionStore* db, const Identity& who, const std::vector<req::Send>& sends,
                    const std::vector<std::optional<std::string>>& rids, RepliesDone done) {
    if (!db) {
        std::vector<Handled> out;
        for (const auto& rid : rids)
            out.push_back(error_reply(unavailable("database unreachable, retry with the same request"), rid));
        return done(std::move(out));
    }
    auto results = db->send_run(who, sends);
    if (results.empty()) // the conversation's row is held: nothing was written
        results.assign(sends.size(), unavailable("conversation busy, retry with the same request"));
    finish_run(ctx, who, sends, rids, std::move(results), std::move(done));
}

void finish_run(ApiContext& ctx, const Identity& who, const std::vector<req::Send>& sends,
                const std::vector<std::optional<std::string>>& rids, std::vector<Outcome<Store::SendResult>> results,
                RepliesDone done, Metrics* metrics) {
    Notes notes; // a duplicate publishes again (a gateway may have died before it did)
    std::vector<Event> events;
    for (std::size_t i = 0; i < results.size(); ++i) {
        const auto& r = results[i];
        if (!r) continue;
        notes.push_back("e " + r->sent.conv + " " + std::to_string(r->sent.seq));
        Event ev;
        ev.conv = r->sent.conv;
        ev.seq = r->sent.seq;
        ev.mid = r->sent.mid;
        ev.kind = "msg";
        ev.sender = who.user;
        ev.body = sends[i].body;
        ev.cmid = sends[i].cmid;
        ev.reply_to = sends[i].reply_to; // contract section 12: a push carries it as a page does
        ev.attachments = attachments_from_json(r->attachments);
        ev.ts = r->ts;
        ev.epoch = r->sent.epoch;
        events.push_back(std::move(ev));
    }
    // Own subscribers first: no read, no wait for the bus's round trip.
    if (ctx.committed && !events.empty()) ctx.committed(events);
    // Contract section 6, send step 5: the replies only after the events'
    // notification was handed to the bus; with the PostgreSQL bus it went
    // with the COMMIT itself (Store::notify_in_commit), nothing to wait for.
    const auto handed = std::chrono::steady_clock::now();
    const bool publishing = !notes.empty() && ctx.bus && !ctx.store.notifies_in_commit();
    if (!publishing) metrics = nullptr; // nothing published: no publish stage
    auto complete = [&ctx, results = std::move(results), rids, done = std::move(done), metrics,
                     handed](bool published) mutable {
        if (metrics)
            metrics->observe_send_stage(Metrics::SendStage::publish,
                                        std::chrono::duration<double>(std::chrono::steady_clock::now() - handed).count());
        if (!published)
            for (auto& r : results)
                if (r) r = unpublished();
        std::vector<Handled> out;
        out.reserve(results.size());
        const auto answered = std::chrono::steady_clock::now();
        for (std::size_t i = 0; i < results.size(); ++i) {
            out.push_back(send_reply(ctx, results[i], rids[i]));
            out.back().answered = answered;
        }
        done(std::move(out));
    };
    if (!publishing) return complete(true);
    ctx.bus->publish(std::move(notes), std::move(complete));
}

std::vector<Handled> send_run_and_wait(ApiContext& ctx, SessionStore* db, const Identity& who,
                                       const std::vector<req::Send>& sends,
                                       const std::vector<std::optional<std::string>>& rids) {
    auto promise = std::make_shared<std::promise<std::vector<Handled>>>();
    auto result = promise->get_future();
    send_run_async(ctx, db, who, sends, rids, [promise](std::vector<Handled> hs) { promise->set_value(std::move(hs)); });
    return result.get();
}

} // namespace im
