// The backend API (spec/server.md "Backend API", docs/integration.md): HTTP +
// JSON for the product's own server, on its own listener (--api-listen),
// never on the WebSocket port. Requests arrive through HttpSession (its API
// mode); the route table below is the one source of the routing, the
// scopes and GET /v1/openapi.json. Database work runs on the pool workers;
// the provisioning commands are those of the admin CLI (provisioning.hpp);
// a message goes through the gateway's send path (SendScheduler, send_scheduler.hpp).
#pragma once

#include "core/address_limiter.hpp"
#include "core/faults.hpp"
#include "net/client_address.hpp"
#include "net/net_common.hpp"

#include <boost/json.hpp>
#include <pqxx/pqxx>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace im {

class Gateway;
class Listener;

/// The largest request body the API reads; a longer one answers 413.
inline constexpr std::size_t api_max_body_bytes = 64 * 1024;

/// A body written as it is read (GET /v1/users/{user}/export): each next()
/// runs on a database worker, and the next one only after its bytes were
/// written, so at most one chunk is held, however slow the reader.
struct ApiStream {
    virtual ~ApiStream() = default;
    /// The next bytes; "" at the end. An exception ends the response cut
    /// short (the connection closes without the final chunk).
    virtual std::string next(pqxx::connection_base& c) = 0;
};

struct ApiReply {
    http::status status = http::status::ok;
    std::string body; // JSON; with `stream`: the first chunk
    std::vector<std::pair<http::field, std::string>> headers;
    std::shared_ptr<ApiStream> stream; // set: a chunked body of `body`, then the stream's chunks
};

class BackendApi {
public:
    explicit BackendApi(Gateway& gw);
    ~BackendApi();

    /// Binds --api-listen and starts accepting; returns the bound port.
    unsigned short listen(net::io_context& ioc, std::shared_ptr<Gateway> gw);
    /// Stops accepting (drain). Call on any thread.
    void close();
    void release_listener();

    /// One request from `client` (behind a trusted proxy: the address it
    /// named); `done` is called once, on any thread.
    void handle(http::request<http::string_body> req, ClientAddress client, std::function<void(ApiReply)> done);
    /// The answer to a body over api_max_body_bytes.
    static ApiReply too_large();
    /// The answer to a request whose trusted proxy sent an X-Forwarded-For
    /// without an address where one is needed (400).
    static ApiReply bad_forwarded_for();

    /// The OpenAPI 3 document of every route (the same table the router uses).
    static boost::json::object openapi();

    /// The failed-key count of --api-auth-failures for the routes served
    /// outside handle() (the attachment routes on this listener): whether
    /// `address` is refused now (429), and one more failure of it.
    bool auth_limited(const std::string& address) { return limited(address); }
    void auth_failed(const std::string& address) { failed_auth(address); }

private:
    struct Call;
    void authenticated(const std::shared_ptr<Call>& call, pqxx::connection_base& conn);
    // Failed authentications are counted per address, loopback callers only
    // with --api-auth-failures-exempt none.
    bool counts_failures(const std::string& address) const;
    bool limited(const std::string& address);
    void failed_auth(const std::string& address);

    Gateway& gw_;
    FaultRegistry no_faults_{false}; // the lab's fault switches never reach the API
    std::shared_ptr<Listener> listener_;
    // Failed authentications per client address in the current minute.
    AddressLimiter failures_;
};

} // namespace im
