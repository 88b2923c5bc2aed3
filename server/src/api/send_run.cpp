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

// The reply to one write of a run, in its request's shape; `kind` is the
// write's req::Write alternative (0 send, 1 edit, 2 react).
Handled write_reply(ApiContext& ctx, std::size_t kind, const Outcome<Store::SendResult>& o,
                    const std::optional<std::string>& rid) {
    if (!o) return error_reply(o.error(), rid);
    if (kind == 1) {
        Handled h;
        h.frame = encode_reply(Reply{Edited{o->sent.conv, o->sent.seq, o->sent.dup, o->sent.epoch}}, rid);
        return h;
    }
    if (kind == 2) {
        Reacted r{o->sent.conv, std::nullopt, o->sent.dup, o->changed, o->sent.epoch};
        if (o->sent.seq) r.seq = o->sent.seq;
        Handled h;
        h.frame = encode_reply(Reply{std::move(r)}, rid);
        return h;
    }
    // The commit is durable now; this point tests replies lost after it.
    auto f = ctx.faults.hit("api.after_send_commit");
    if (f == FaultKind::unavailable) return error_reply(unavailable("injected fault"), rid);
    Handled h;
    if (o->drop_reply || f == FaultKind::drop_reply) h.code = "DROPPED";
    else h.frame = encode_reply(o->sent, rid);
    return h;
}

} // namespace

void send_run_async(ApiContext& ctx, SessionStore* db, const Identity& who, const std::vector<req::Write>& writes,
                    const std::vector<std::optional<std::string>>& rids, RepliesDone done) {
    if (!db) {
        std::vector<Handled> out;
        for (const auto& rid : rids)
            out.push_back(error_reply(unavailable("database unreachable, retry with the same request"), rid));
        return done(std::move(out));
    }
    auto results = db->write_run(who, writes);
    if (results.empty()) // the conversation's row is held: nothing was written
        results.assign(writes.size(), unavailable("conversation busy, retry with the same request"));
    finish_run(ctx, who, writes, rids, std::move(results), std::move(done));
}

void finish_run(ApiContext& ctx, const Identity& who, const std::vector<req::Write>& writes,
                const std::vector<std::optional<std::string>>& rids, std::vector<Outcome<Store::SendResult>> results,
                RepliesDone done, Metrics* metrics) {
    Notes notes; // a duplicate publishes again (a gateway may have died before it did)
    std::vector<Event> events;
    std::vector<std::size_t> kinds(writes.size());
    // Sends' notifications went with their COMMIT when the store notifies
    // in it; a change's only when its group's statement did (r->notified).
    bool unannounced = false;
    for (std::size_t i = 0; i < results.size(); ++i) {
        kinds[i] = writes[i].index();
        const auto& r = results[i];
        if (!r) continue;
        const auto* s = std::get_if<req::Send>(&writes[i]);
        if (!s) {
            // An edit, or a react with an event (it changed the state, or
            // is the dup of one that did): announced as a send is. Its
            // event reaches this gateway's subscribers by the bus.
            if (r->sent.seq && (kinds[i] == 1 || r->changed || r->sent.dup)) {
                notes.push_back("e " + r->sent.conv + " " + std::to_string(r->sent.seq));
                unannounced = unannounced || !r->notified;
            }
            continue;
        }
        notes.push_back("e " + r->sent.conv + " " + std::to_string(r->sent.seq));
        unannounced = unannounced || !ctx.store.notifies_in_commit();
        Event ev;
        ev.conv = r->sent.conv;
        ev.seq = r->sent.seq;
        ev.mid = r->sent.mid;
        ev.kind = "msg";
        ev.sender = who.user;
        ev.body = s->body;
        ev.cmid = s->cmid;
        ev.reply_to = s->reply_to; // contract section 12: a push carries it as a page does
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
    const bool publishing = unannounced && ctx.bus;
    if (!publishing) metrics = nullptr; // nothing published: no publish stage
    auto complete = [&ctx, kinds = std::move(kinds), results = std::move(results), rids, done = std::move(done), metrics,
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
            out.push_back(write_reply(ctx, kinds[i], results[i], rids[i]));
            out.back().answered = answered;
        }
        done(std::move(out));
    };
    if (!publishing) return complete(true);
    ctx.bus->publish(std::move(notes), std::move(complete));
}

std::vector<Handled> send_run_and_wait(ApiContext& ctx, SessionStore* db, const Identity& who,
                                       const std::vector<req::Write>& writes,
                                       const std::vector<std::optional<std::string>>& rids) {
    auto promise = std::make_shared<std::promise<std::vector<Handled>>>();
    auto result = promise->get_future();
    send_run_async(ctx, db, who, writes, rids, [promise](std::vector<Handled> hs) { promise->set_value(std::move(hs)); });
    return result.get();
}

} // namespace im
