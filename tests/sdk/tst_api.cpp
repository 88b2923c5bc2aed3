// The public API as an app uses it, linked against the shared library (which
// exports only the API), against the in-process fake server. Issue 26 item 9:
// the models keep working when the app calls client->disconnect() (they are
// wired to the client privately, not through its public signals), and go
// empty when the client is destroyed.
#include "fakeserver.h"

#include <im/client.h>
#include <im/conversationlistmodel.h>
#include <im/messagelistmodel.h>
#include <im/outboxmodel.h>

#include <QtCore/QTemporaryDir>
#include <QtTest/QSignalSpy>
#include <QtTest/QtTest>

#include <memory>

using im::Client;
using im::ConnectionState;
using im::MessageState;

class TestApi : public QObject {
    Q_OBJECT
private slots:
    void models_keep_working_after_the_app_disconnects_every_client_signal();
    void models_let_go_of_a_destroyed_client();
};

namespace {

int rowOfCmid(const im::MessageListModel &m, const QString &cmid) {
    for (int r = 0; r < m.count(); ++r)
        if (m.get(r, im::MessageListModel::CmidRole).toString() == cmid)
            return r;
    return -1;
}

} // namespace

void TestApi::models_keep_working_after_the_app_disconnects_every_client_signal() {
    QTemporaryDir dir;
    FakeServer server;
    server.listen();
    server.convs[QStringLiteral("c1")].members = {QStringLiteral("ana"), QStringLiteral("ben")};
    server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("from ben"));
    Client client;
    client.setServers({server.url()});
    client.setCredentials(QStringLiteral("tok-ana"));
    client.setReconnectBackoff(40, 200);
    im::ConversationListModel convs(&client);
    im::MessageListModel messages(&client, QStringLiteral("c1"));
    im::OutboxModel outbox(&client);
    QVERIFY(client.open(dir.filePath(QStringLiteral("a.db"))));

    // What an app may do: drop every connection of the Client's signals
    // (QObject::disconnect() with no arguments), e.g. when a view goes away.
    client.disconnect();

    // Offline: the draft shows in the outbox and the timeline at once.
    const QString cmid = client.send(QStringLiteral("c1"), QStringLiteral("mine"));
    QVERIFY(!cmid.isEmpty());
    QCOMPARE(outbox.depth(), 1);
    QCOMPARE(outbox.get(0, im::OutboxModel::CmidRole).toString(), cmid);
    QTRY_COMPARE(messages.count(), 1);
    QCOMPARE(messages.get(0, im::MessageListModel::StateRole).toInt(), int(MessageState::Pending));

    // Online: the conversation list fills from `convs`, ben's message and
    // ours (now Sent, with its seq) show, the outbox empties.
    client.connectToServer();
    QTRY_COMPARE(client.connectionState(), ConnectionState::Connected);
    QTRY_COMPARE(convs.count(), 1);
    QCOMPARE(convs.get(0, im::ConversationListModel::ConvRole).toString(), QStringLiteral("c1"));
    QTRY_COMPARE(messages.count(), 2);
    QTRY_COMPARE(messages.get(rowOfCmid(messages, cmid), im::MessageListModel::StateRole).toInt(),
                 int(MessageState::Sent));
    QCOMPARE(messages.get(rowOfCmid(messages, cmid), im::MessageListModel::SeqRole).toLongLong(), 2);
    QTRY_COMPARE(outbox.depth(), 0);
    QTRY_COMPARE(convs.get(0, im::ConversationListModel::HeadRole).toLongLong(), 2);

    // The typed report still follows every error for a receiver connected
    // after the disconnect().
    QSignalSpy typed(&client, &Client::errorReported);
    QVERIFY(client.send(QStringLiteral("c1"), QString()).isEmpty()); // refused: empty body
    QCOMPARE(typed.size(), 1);
    QCOMPARE(typed.at(0).at(0).value<im::Error>(), im::Error::InvalidArgument);
}

void TestApi::models_let_go_of_a_destroyed_client() {
    QTemporaryDir dir;
    auto client = std::make_unique<Client>();
    QVERIFY(client->open(dir.filePath(QStringLiteral("a.db"))));
    client->send(QStringLiteral("c1"), QStringLiteral("queued"));
    im::MessageListModel messages(client.get(), QStringLiteral("c1"));
    im::OutboxModel outbox(client.get());
    im::ConversationListModel convs(client.get());
    QCOMPARE(messages.count(), 1);
    QCOMPARE(outbox.depth(), 1);
    client->disconnect();
    client.reset();
    QCOMPARE(messages.client(), nullptr);
    QCOMPARE(messages.count(), 0);
    QCOMPARE(outbox.client(), nullptr);
    QCOMPARE(outbox.depth(), 0);
    QCOMPARE(outbox.rowCount(), 0);
    QCOMPARE(convs.client(), nullptr);
    QCOMPARE(convs.count(), 0);
}

QTEST_GUILESS_MAIN(TestApi)
#include "tst_api.moc"
