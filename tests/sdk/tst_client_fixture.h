// The fixture of the tst_client_* tests (one QtTest executable per subject):
// an im::Client on a fresh SQLite file against an in-process fake server
// (fakeserver.h) with conversation c1 (ana, ben), short timeouts and
// backoffs, and probes of the client's store through a separate connection.
#pragma once

#include "fakeserver.h"
#include "sdktestutil.h"

#include <im/client.h>

#include <QtCore/QTemporaryDir>
#include <QtTest/QtTest>

using im::Client;
using im::ConnectionState;
using im::MessageState;

namespace {

// No request times out in these tests unless the test asks for it: a reply
// that a loaded machine delays is waited for, never resent, so a test may
// count requests exactly. A test whose replies are lost on purpose (dropped
// by the fake server or by the QA hook) sets kLostReplyTimeoutMs itself.
constexpr int kNoTimeoutMs = 600000;
constexpr int kLostReplyTimeoutMs = 400;

struct Fixture {
    QTemporaryDir dir;
    FakeServer server;
    Client client;
    QString db;

    Fixture() {
        server.listen();
        server.convs[QStringLiteral("c1")].members = {QStringLiteral("ana"), QStringLiteral("ben")};
        client.setServers({server.url()});
        client.setCredentials(QStringLiteral("tok-ana"));
        client.setRequestTimeout(kNoTimeoutMs);
        client.setRetryBackoff(40, 300);
        client.setReconnectBackoff(40, 200);
        db = dir.filePath(QStringLiteral("client.db"));
    }
    bool openAndConnect() {
        if (!client.open(db))
            return false;
        client.connectToServer();
        return QTest::qWaitFor([this] { return client.connectionState() == ConnectionState::Connected; }, 5000);
    }
    qint64 cursor(const QString &conv) {
        return sqlScalar(db, QStringLiteral("SELECT after FROM conversations WHERE conv = ?"), {conv}).toLongLong();
    }
    qint64 eventCount(const QString &conv) {
        return sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = ?"), {conv}).toLongLong();
    }
    qint64 outboxRows() { return sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM outbox")).toLongLong(); }
    qint64 state(const QString &cmid) {
        return sqlScalar(db, QStringLiteral("SELECT state FROM local_messages WHERE cmid = ?"), {cmid}).toLongLong();
    }
    int requestsOf(const QString &t) { return int(server.requests(t).size()); }
};

} // namespace
