// A client of a RealServer for the tests that run the SDK against the real
// imserver: the user's device token, a 10 s request timeout and short
// backoffs, on the store `path` (an open() failure is logged; the caller
// checks isOpen()).
#pragma once

#include "realserver.h"

#include <im/client.h>

#include <memory>

inline std::unique_ptr<im::Client> makeRealClient(const RealServer &server, const QString &user, const QString &path) {
    auto c = std::make_unique<im::Client>();
    c->setServers({server.url});
    c->setCredentials(server.tokens.value(user));
    c->setRequestTimeout(10000);
    c->setReconnectBackoff(100, 1000);
    c->setRetryBackoff(100, 800);
    if (!c->open(path))
        qWarning("open: %s", qPrintable(c->lastError()));
    return c;
}
