// GUI test of imdemo over wss:// against the real server serving TLS with a
// certificate from a throwaway CA (openssl CLI, made at test time). Drives
// the real widgets on the offscreen platform: a window trusting the server's
// CA (--ca-file) connects and sends; the sign-in dialog's pin field refuses a
// malformed pin and connects with the right one; a window trusting another
// CA shows TLS_ERROR, never connects (it retries with the backoff) and keeps
// the message in its outbox; a CA file replaces the system store (what the
// connection panel says), not adds to it.
#include "realserver.h"
#include "throwawayca.h"

#include "chatwindow.h"
#include "signindialog.h"
#include "windowmanager.h"

#include <im/client.h>
#include <im/conversationlistmodel.h>
#include <im/messagelistmodel.h>

#include <QtNetwork/QSslCertificate>
#include <QtNetwork/QSslConfiguration>
#include <QtWidgets/QDialogButtonBox>
#include <QtWidgets/QLabel>
#include <QtWidgets/QLineEdit>
#include <QtWidgets/QListWidget>
#include <QtWidgets/QPushButton>
#include <QtWidgets/QTableView>
#include <QtTest/QtTest>

using im::ConnectionState;
using im::MessageListModel;
using im::MessageState;

namespace {

constexpr int kSettle = 30000;

template <typename T> T *widget(QWidget *w, const char *name) {
    T *c = w->findChild<T *>(QString::fromLatin1(name));
    if (!c)
        qFatal("widget %s not found", name);
    return c;
}

/// State and seq of the one row of `body` in the window's message list.
QPair<MessageState, qint64> rowOfBody(ChatWindow *w, const QString &body) {
    const MessageListModel *m = w->messages();
    for (int r = 0; r < m->rowCount(); ++r)
        if (m->get(r, MessageListModel::BodyRole).toString() == body)
            return {MessageState(m->get(r, MessageListModel::StateRole).toInt()),
                    m->get(r, MessageListModel::SeqRole).toLongLong()};
    return {MessageState(-1), 0};
}

} // namespace

class TestDemoTls : public QObject {
    Q_OBJECT
private slots:
    void initTestCase();
    void cleanupTestCase();
    void cleanup();
    void window_trusting_the_servers_ca_connects_over_wss_and_sends();
    void sign_in_dialog_refuses_a_malformed_pin_and_connects_with_the_right_one();
    void window_trusting_another_ca_shows_tls_error_and_keeps_the_message_pending();
    void unreadable_ca_file_keeps_the_window_from_connecting();
    void ca_file_replaces_the_system_store_as_the_panel_says();

private:
    QUrl wssUrl() const;
    AppOptions options(const QString &caFile = {}, const QString &pin = {}) const;
    Session sessionOf(const QString &user) const;
    void selectAndSend(ChatWindow *w, const QString &conv, const QString &body);

    QTemporaryDir dir_;
    std::unique_ptr<RealServer> server_;
    std::unique_ptr<WindowManager> manager_;
    TokenFile tokens_;
    QString caOne_, caOther_;
};

QUrl TestDemoTls::wssUrl() const {
    QUrl u = server_->url;
    u.setScheme(QStringLiteral("wss"));
    return u;
}

AppOptions TestDemoTls::options(const QString &caFile, const QString &pin) const {
    AppOptions o;
    o.tokens = tokens_;
    o.servers = {wssUrl()};
    o.dataDir = dir_.filePath(QStringLiteral("data-%1").arg(QTest::currentTestFunction()));
    o.caFile = caFile;
    o.pinSha256 = pin;
    return o;
}

Session TestDemoTls::sessionOf(const QString &user) const {
    const DemoUser *u = tokens_.find(user);
    Session s;
    if (!u)
        return s;
    s.token = u->token;
    s.user = u->user;
    s.device = u->device;
    return s;
}

// Clicks the conversation in the list, types the body and presses Return.
void TestDemoTls::selectAndSend(ChatWindow *w, const QString &conv, const QString &body) {
    QTRY_VERIFY_WITH_TIMEOUT(w->conversations()->indexOf(conv) >= 0, kSettle);
    auto *view = widget<QTableView>(w, "convView");
    const QRect rect = view->visualRect(view->model()->index(w->conversations()->indexOf(conv), 0));
    QTest::mouseClick(view->viewport(), Qt::LeftButton, {}, rect.center());
    QTRY_COMPARE(w->currentConversation(), conv);
    auto *edit = widget<QLineEdit>(w, "sendEdit");
    edit->setFocus();
    QTest::keyClicks(edit, body);
    QTest::keyClick(edit, Qt::Key_Return);
    QCOMPARE(edit->text(), QString());
}

void TestDemoTls::initTestCase() {
    QVERIFY(dir_.isValid());
    caOne_ = throwawayca::make(QDir(dir_.path()), QStringLiteral("one"));
    caOther_ = throwawayca::make(QDir(dir_.path()), QStringLiteral("other"));
    QVERIFY(!caOne_.isEmpty() && !caOther_.isEmpty());
    const QString bin = qEnvironmentVariable("IMSERVER_BIN");
    QVERIFY2(!bin.isEmpty(), "IMSERVER_BIN is not set (ctest sets it)");
    server_ = std::make_unique<RealServer>(bin);
    server_->serverArgs = {QStringLiteral("--tls-cert"), dir_.filePath(QStringLiteral("one.crt")),
                           QStringLiteral("--tls-key"), dir_.filePath(QStringLiteral("one.key"))};
    const QString err = server_->start();
    QVERIFY2(err.isEmpty(), qPrintable(err));
    QString tokErr;
    QVERIFY2(tokens_.load(server_->tokenFile, &tokErr), qPrintable(tokErr));
}

void TestDemoTls::cleanupTestCase() {
    manager_.reset();
    server_.reset();
}

// Each test gets its own window manager (and data dir): nothing carries over.
void TestDemoTls::cleanup() { manager_.reset(); }

void TestDemoTls::window_trusting_the_servers_ca_connects_over_wss_and_sends() {
    manager_ = std::make_unique<WindowManager>(options(caOne_));
    ChatWindow *w = manager_->openWindow(sessionOf(QStringLiteral("ana")));
    QVERIFY(QTest::qWaitForWindowExposed(w));
    QCOMPARE(widget<QLabel>(w, "tlsLabel")->text(),
             QStringLiteral("TLS: wss:// with only CA one-ca.crt (instead of the system store)"));
    QTRY_COMPARE_WITH_TIMEOUT(w->client()->connectionState(), ConnectionState::Connected, kSettle);
    QTRY_VERIFY(widget<QLabel>(w, "statusConnection")->text().startsWith(QStringLiteral("Connected")));
    QCOMPARE(w->client()->servers().first().scheme(), QStringLiteral("wss"));

    const QString body = QStringLiteral("typed over TLS");
    selectAndSend(w, QStringLiteral("team"), body);
    QTRY_COMPARE_WITH_TIMEOUT(rowOfBody(w, body).first, MessageState::Sent, kSettle);
    QVERIFY(rowOfBody(w, body).second > 0);
    QCOMPARE(w->client()->pendingCount(), 0);
    QVERIFY2(!widget<QLabel>(w, "errorLabel")->text().contains(QStringLiteral("TLS_ERROR")),
             qPrintable(widget<QLabel>(w, "errorLabel")->text()));
}

void TestDemoTls::sign_in_dialog_refuses_a_malformed_pin_and_connects_with_the_right_one() {
    manager_ = std::make_unique<WindowManager>(options());
    QSignalSpy opened(manager_.get(), &WindowManager::windowOpened);
    SignInDialog *dialog = manager_->showSignIn(nullptr, QStringLiteral("ben"));
    QVERIFY(QTest::qWaitForWindowExposed(dialog));
    QPointer<SignInDialog> alive(dialog);
    auto *pin = widget<QLineEdit>(dialog, "pinEdit");
    auto *ok = dialog->findChild<QDialogButtonBox *>()->button(QDialogButtonBox::Ok);
    QVERIFY(ok);
    QCOMPARE(widget<QListWidget>(dialog, "userList")->currentItem()->data(Qt::UserRole).toString(),
             QStringLiteral("ben"));

    // A malformed pin: said in the dialog, which stays open; no window.
    QTest::keyClicks(pin, QStringLiteral("AB:CD:nothex"));
    QTest::mouseClick(ok, Qt::LeftButton);
    QVERIFY(alive && dialog->isVisible());
    QVERIFY2(widget<QLabel>(dialog, "signInNote")->text().contains(QStringLiteral("SHA-256")),
             qPrintable(widget<QLabel>(dialog, "signInNote")->text()));
    QCOMPARE(opened.count(), 0);

    // The server certificate's own fingerprint: trusted without any CA.
    const QString fp = throwawayca::fingerprint(dir_.filePath(QStringLiteral("one.crt")));
    QCOMPARE(fp.size(), 95);
    pin->clear();
    QTest::keyClicks(pin, fp);
    QTest::mouseClick(ok, Qt::LeftButton);
    QTRY_COMPARE(opened.count(), 1);
    QPointer<ChatWindow> w = opened.at(0).at(0).value<ChatWindow *>();
    QVERIFY(w);
    QCOMPARE(w->session().pinSha256, fp);
    QVERIFY(w->session().caFile.isEmpty());
    QVERIFY(widget<QLabel>(w, "tlsLabel")->text().contains(QStringLiteral("pinned SHA-256 ") + fp.left(11)));
    QTRY_COMPARE_WITH_TIMEOUT(w->client()->connectionState(), ConnectionState::Connected, kSettle);
    QTRY_COMPARE_WITH_TIMEOUT(w->client()->userId(), QStringLiteral("ben"), kSettle);
}

void TestDemoTls::window_trusting_another_ca_shows_tls_error_and_keeps_the_message_pending() {
    manager_ = std::make_unique<WindowManager>(options(caOther_));
    ChatWindow *w = manager_->openWindow(sessionOf(QStringLiteral("cy")));
    QVERIFY(QTest::qWaitForWindowExposed(w));
    auto *error = widget<QLabel>(w, "errorLabel");
    QTRY_VERIFY_WITH_TIMEOUT(error->text().contains(QStringLiteral("TLS_ERROR")), kSettle);
    // Never connected; retried with the backoff (issue 26 item 8: a captive
    // portal goes away), so not Disconnected for good either.
    QVERIFY(w->client()->connectionState() != ConnectionState::Connected);
    QTRY_VERIFY_WITH_TIMEOUT(w->client()->connectionState() == ConnectionState::Reconnecting, kSettle);
    QVERIFY(w->client()->lastError().startsWith(QStringLiteral("TLS_ERROR")));
    // The store of this install knows no conversation yet: send through the
    // client (the send box needs a selected conversation) and see it kept.
    QSignalSpy states(w->client(), &im::Client::connectionStateChanged);
    const QString cmid = w->client()->send(QStringLiteral("team"), QStringLiteral("never over a wrong CA"));
    QVERIFY(!cmid.isEmpty());
    QCOMPARE(w->client()->messageState(cmid), MessageState::Pending);
    // Kept across the next attempts, not only right after send(): wait for
    // an attempt made after it (Connecting) to fail again (Reconnecting).
    QTRY_VERIFY_WITH_TIMEOUT(
        [&] {
            bool tried = false;
            for (const QList<QVariant> &args : states) {
                const auto st = args.at(0).value<ConnectionState>();
                if (st == ConnectionState::Connecting)
                    tried = true;
                else if (tried && st == ConnectionState::Reconnecting)
                    return true;
            }
            return false;
        }(),
        kSettle);
    QVERIFY(w->client()->lastError().startsWith(QStringLiteral("TLS_ERROR")));
    QCOMPARE(w->client()->messageState(cmid), MessageState::Pending);
    QCOMPARE(w->client()->pendingCount(), 1);
    QVERIFY(w->client()->connectionState() != ConnectionState::Connected);
}

void TestDemoTls::unreadable_ca_file_keeps_the_window_from_connecting() {
    manager_ = std::make_unique<WindowManager>(options());
    Session s = sessionOf(QStringLiteral("ana"));
    s.caFile = dir_.filePath(QStringLiteral("missing-ca.crt"));
    QVERIFY(!checkTlsSettings(s.caFile, {}).isEmpty()); // the dialog and --ca-file refuse it up front
    ChatWindow *w = manager_->openWindow(s);
    QVERIFY(QTest::qWaitForWindowExposed(w));
    const QString error = widget<QLabel>(w, "errorLabel")->text();
    QVERIFY2(error.startsWith(QStringLiteral("TLS settings refused, not connecting")), qPrintable(error));
    QCOMPARE(w->client()->connectionState(), ConnectionState::Disconnected);
    QVERIFY(!w->client()->nextReconnectAt().isValid());
}

// The connection panel says a CA file is trusted INSTEAD of the system
// store: that is what the SDK does (Client::setTrustedCaFile). The
// process's default TLS configuration is what the SDK starts from (the
// system store as Qt sees it): with the server's CA added there, a window
// without a CA file connects, and a window whose CA file holds another CA
// does not, although the "system store" would trust the server.
void TestDemoTls::ca_file_replaces_the_system_store_as_the_panel_says() {
    const QSslConfiguration saved = QSslConfiguration::defaultConfiguration();
    const QList<QSslCertificate> one = QSslCertificate::fromPath(caOne_);
    QCOMPARE(one.size(), 1);
    QSslConfiguration withOne = saved;
    withOne.addCaCertificates(one);
    QSslConfiguration::setDefaultConfiguration(withOne);
    struct Restore {
        QSslConfiguration c;
        ~Restore() { QSslConfiguration::setDefaultConfiguration(c); }
    } restore{saved};

    manager_ = std::make_unique<WindowManager>(options());
    ChatWindow *system = manager_->openWindow(sessionOf(QStringLiteral("ana")));
    QVERIFY(QTest::qWaitForWindowExposed(system));
    QCOMPARE(widget<QLabel>(system, "tlsLabel")->text(), QStringLiteral("TLS: wss:// with system trust store"));
    QTRY_COMPARE_WITH_TIMEOUT(system->client()->connectionState(), ConnectionState::Connected, kSettle);

    Session s = sessionOf(QStringLiteral("ben"));
    s.caFile = caOther_;
    ChatWindow *only = manager_->openWindow(s);
    QVERIFY(QTest::qWaitForWindowExposed(only));
    const QString label = widget<QLabel>(only, "tlsLabel")->text();
    QVERIFY2(label.contains(QStringLiteral("only CA other-ca.crt (instead of the system store)")), qPrintable(label));
    QTRY_VERIFY_WITH_TIMEOUT(widget<QLabel>(only, "errorLabel")->text().contains(QStringLiteral("TLS_ERROR")),
                             kSettle);
    QVERIFY(only->client()->connectionState() != ConnectionState::Connected);
}

QTEST_MAIN(TestDemoTls)
#include "tst_demotls.moc"
