// The notification bus: how every gateway learns of every commit (contract
// section 7). One interface for the whole server; PostgreSQL LISTEN/NOTIFY
// (pg_bus.hpp) is the default implementation, and a deployment that outgrows
// it can put an existing message bus behind the same three calls.
//
// Payloads carry ids only (store.hpp lists the kinds); a gateway reads the
// rows itself. Publishing happens after COMMIT, so payloads of one
// conversation may reach subscribers out of seq order: the consumer
// (notifier.hpp) reads ranges, never single rows, and keeps seq order itself.
// One exception, for the PostgreSQL bus only: sends NOTIFY inside their own
// transaction (Store::notify_in_commit, --notify-in-commit), which the
// listening sessions receive like the publisher's payloads.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace im {

class NotificationBus {
public:
    struct Handlers {
        /// A batch of payloads as the bus delivered them. Called on the bus's
        /// own thread, one batch at a time.
        std::function<void(const std::vector<std::string>&)> deliver;
        /// The subscription was lost and is back: payloads may be missing,
        /// every subscriber must `resync`.
        std::function<void()> resync;
    };

    virtual ~NotificationBus() = default;
    /// Starts delivering to `h` (once, before any publish is expected to arrive).
    virtual void subscribe(Handlers h) = 0;
    /// Stops delivering; pending publishes are answered false.
    virtual void stop() = 0;
    /// Hands payloads of committed transactions to the bus. `done(true)`
    /// once they are handed over (a reply may go out), `done(false)` when the
    /// bus cannot take them (the request answers UNAVAILABLE; its resend is a
    /// duplicate, which publishes again). `done` may run on any thread.
    virtual void publish(std::vector<std::string> payloads, std::function<void(bool)> done) = 0;
    /// True while the subscription is live (what /readyz reports): false
    /// before the first connection and while the bus connection is down.
    virtual bool connected() const = 0;
    /// publish() and wait for the outcome.
    bool publish_and_wait(std::vector<std::string> payloads);
};

} // namespace im
