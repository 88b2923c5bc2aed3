// Webhooks through the backend API (server.md "Events to the app's backend
// (webhooks)"): the answers of POST/GET/DELETE /v1/webhooks..., one
// implementation the admin CLI's `webhook` commands print as well. The
// bodies arrive checked against the route table (backend_api.cpp); the
// storage is store/store_webhooks.hpp. Failures: AdminError, or a database
// exception.
#pragma once

#include <boost/json.hpp>
#include <pqxx/pqxx>

#include <string>

namespace im::webhooks {

struct ApiOut {
    int status = 200;
    boost::json::object body;
};

/// {"url","events"?,"secret"?} -> 201 {"id"} (and "secret" when one was made).
ApiOut api_add(pqxx::connection_base& c, const boost::json::object& body);
/// 200 {"webhooks":[{"id","url","events","created","backlog","failed","last_error",...}]}, never a secret.
ApiOut api_list(pqxx::connection_base& c);
ApiOut api_remove(pqxx::connection_base& c, const std::string& id);
/// query {"status"?: "failed", "limit"?} -> 200 {"deliveries":[...]}.
ApiOut api_deliveries(pqxx::connection_base& c, const std::string& id, const boost::json::object& query);
/// {"conv","from_seq"} -> 200 {"webhook","conv","from_seq"}.
ApiOut api_replay(pqxx::connection_base& c, const std::string& id, const boost::json::object& body);

} // namespace im::webhooks
