// GUI test of imdemo against the real server (demo users ana, ben, cy;
// conversations ana-ben and team). Drives the real widgets with QTest key
// and mouse events on the offscreen platform; asserts on what the widgets
// show and on the SDK models behind them.
#include "exerelative.h"
#include "realserver.h"
#include "sdktestutil.h"

#include "chatwindow.h"
#include "faultclient.h"
#include "faultpanel.h"
#include "faultproxy.h"
#include "logpanel.h"
#include "messageactions.h"
#include "messagedelegate.h"
#include "messagepanel.h"
#include "presencelist.h"
#include "searchpanel.h"
#include "settingspanel.h"
#include "signindialog.h"
#include "windowmanager.h"

#include <im/client.h>
#include <im/conversationlistmodel.h>
#include <im/messagelistmodel.h>
#include <im/outboxmodel.h>
#include <im/reversedproxymodel.h>
#include <im/searchmodel.h>
#include <im/testing.h>

#include <QtGui/QAction>
#include <QtGui/QInputMethodEvent>
#include <QtNetwork/QTcpServer>
#include <QtNetwork/QTcpSocket>
#include <QtWidgets/QApplication>
#include <QtWidgets/QCheckBox>
#include <QtWidgets/QComboBox>
#include <QtWidgets/QDialogButtonBox>
#include <QtWidgets/QLabel>
#include <QtWidgets/QLineEdit>
#include <QtWidgets/QListView>
#include <QtWidgets/QListWidget>
#include <QtWidgets/QMenu>
#include <QtWidgets/QPlainTextEdit>
#include <QtWidgets/QPushButton>
#include <QtWidgets/QScrollBar>
#include <QtWidgets/QSpinBox>
#include <QtWidgets/QStatusBar>
#include <QtWidgets/QTableView>
#include <QtTest/QtTest>

#include <QtNetwork/QNetworkAccessManager>
#include <QtNetwork/QNetworkReply>

#ifndef IM_DEMO_SCREENSHOT
#error "IM_DEMO_SCREENSHOT must name the default screenshot path (in the build tree, relative to the executable)"
#endif

using im::ConversationListModel;
using im::MessageListModel;
using im::MessageState;

namespace {

constexpr int kSettle = 30000; // ms: a resend after a timeout + backoff fits easily

template <typename T> T *child(QWidget *w, const char *name) {
    T *c = w->findChild<T *>(QString::fromLatin1(name));
    if (!c)
        qFatal("widget %s not found", name);
    return c;
}

/// Rows of `model` whose body is `body`.
QList<int> rowsWithBody(const MessageListModel *model, const QString &body) {
    QList<int> rows;
    for (int r = 0; r < model->rowCount(); ++r)
        if (model->get(r, MessageListModel::BodyRole).toString() == body)
            rows << r;
    return rows;
}

/// "seq/state/cmid/dup" of every row with `body` (for failure messages).
QString dump(const MessageListModel *model, const QString &body) {
    QStringList out;
    for (int r : rowsWithBody(model, body))
        out << QStringLiteral("[row %1 seq %2 state %3 cmid %4 dup %5]")
                   .arg(r)
                   .arg(model->get(r, MessageListModel::SeqRole).toLongLong())
                   .arg(model->get(r, MessageListModel::StateRole).toInt())
                   .arg(model->get(r, MessageListModel::CmidRole).toString())
                   .arg(model->get(r, MessageListModel::DupRole).toBool());
    return out.join(QLatin1Char(' '));
}

int rowOfCmid(const MessageListModel *model, const QString &cmid) {
    for (int r = 0; r < model->rowCount(); ++r)
        if (model->get(r, MessageListModel::CmidRole).toString() == cmid)
            return r;
    return -1;
}

int rowOf(const MessageListModel *model, const QString &body) {
    const QList<int> rows = rowsWithBody(model, body);
    return rows.size() == 1 ? rows.first() : -1;
}

MessageState stateOf(const MessageListModel *model, const QString &body) {
    const int r = rowOf(model, body);
    return r < 0 ? MessageState(-1) : MessageState(model->get(r, MessageListModel::StateRole).toInt());
}

/// Arms `point`=`action` for `count` hits (0: until cleared) through the
/// window's server fault panel; the panel's answer label says how it went.
void armServerFault(ChatWindow *w, const QString &point, const QString &action, int count) {
    auto *p = child<QComboBox>(w, "faultPoint");
    auto *a = child<QComboBox>(w, "faultAction");
    p->setCurrentIndex(p->findText(point));
    a->setCurrentIndex(a->findText(action));
    child<QSpinBox>(w, "faultCount")->setValue(count);
    QTest::mouseClick(child<QPushButton>(w, "armFaultButton"), Qt::LeftButton);
}

/// The message view's row of the timeline model's row `modelRow`: the view
/// shows the model upside down (newest at the bottom) through the SDK's
/// im::ReversedProxyModel.
int viewRow(ChatWindow *w, int modelRow) {
    auto *order = child<im::ReversedProxyModel>(w, "messageOrder");
    return order->mapFromSource(w->messages()->index(modelRow)).row();
}

/// What the message view shows in `column` for the row of `body`.
QString shown(ChatWindow *w, const QString &body, int column) {
    const int r = rowOf(w->messages(), body);
    if (r < 0)
        return QStringLiteral("<no single row>");
    auto *view = child<QTableView>(w, "messageView");
    return view->model()->index(viewRow(w, r), column).data().toString();
}

// One counter of the server's GET /metrics (-1 when unreadable); a line
// missing from the output is a counter still at 0.
qint64 metric(const QUrl &wsUrl, const QString &line) {
    QNetworkAccessManager nam;
    QUrl u = FaultClient::labUrl(wsUrl);
    u.setPath(QStringLiteral("/metrics"));
    QNetworkReply *r = nam.get(QNetworkRequest(u));
    if (!QTest::qWaitFor([r] { return r->isFinished(); }, 10000))
        return -1;
    r->deleteLater();
    if (r->error() != QNetworkReply::NoError)
        return -1;
    for (const QByteArray &raw : r->readAll().split('\n')) {
        const QString l = QString::fromUtf8(raw);
        if (l.startsWith(line + QLatin1Char(' ')))
            return l.mid(line.size() + 1).trimmed().toLongLong();
    }
    return 0;
}

const QString kDroppedSends = QStringLiteral("im_requests_total{t=\"send\",code=\"DROPPED\"}");

qint64 unreadOf(ChatWindow *w, const QString &conv) {
    const int r = w->conversations()->indexOf(conv);
    return r < 0 ? -1 : w->conversations()->get(r, ConversationListModel::UnreadRole).toLongLong();
}

} // namespace

class TestDemoApp : public QObject {
    Q_OBJECT
private slots:
    void initTestCase();
    void init();
    void cleanupTestCase();
    void signed_in_window_shows_connected_with_the_gateway_id();
    void sign_in_dialog_opens_a_second_window_as_another_user();
    void typed_message_shows_sent_with_a_seq_on_both_sides();
    void offline_send_shows_pending_then_sent_exactly_once();
    void unread_count_rises_and_falls_when_the_conversation_is_viewed();
    void client_dropped_reply_settles_sent_once_with_the_same_cmid();
    void server_fault_drop_reply_settles_sent_once();
    void fault_panel_shows_the_servers_answer_to_a_bad_fault_spec();
    void fault_client_posts_to_lab_fault_and_reads_404_as_faults_disabled();
    void recall_from_the_context_menu_shows_recalled_on_both_sides();
    void close_socket_now_reconnects_and_the_outbox_drains();
    void outbox_panel_cancels_a_pending_entry_and_refuses_one_on_the_wire();
    void outbox_panel_shows_what_a_pipelined_message_waits_behind();
    void discard_removes_a_failed_message_from_the_view_and_the_store();
    void history_view_shows_a_gap_fills_it_and_loads_older();
    void message_view_shows_the_newest_at_the_bottom_and_loads_older_on_a_scroll_to_the_top();
    void token_panel_shows_the_expiry_and_recovers_from_a_rejected_token();
    void held_drafts_show_apart_from_pending_and_are_discarded();
    void disconnect_and_connect_buttons_drive_the_client();
    void reset_install_then_connect_without_closing_the_window();
    void log_pane_shows_the_sdks_im_sdk_lines();
    void send_window_of_one_keeps_a_single_request_in_flight();
    void reconnect_backoff_setting_shows_in_the_countdown();
    void retry_backoff_setting_spaces_the_resends();
    void silent_server_keeps_a_send_pending_until_the_keepalive_reconnects();
    // search
    void search_box_highlights_jumps_to_the_message_and_loads_what_is_missing();
    void screenshot_of_the_main_window_is_saved();
    // typing and presence
    void typing_in_the_send_box_shows_is_typing_under_the_other_timeline();
    void people_list_shows_online_dots_and_last_seen();
    // replies, edits, reactions
    void reply_from_the_menu_shows_the_quote_on_both_sides();
    void edit_of_your_message_shows_the_edited_body_on_both_sides();
    void reactions_show_counts_and_mine_highlighted_on_both_sides_and_unreact();
    void edit_of_another_users_message_shows_not_sender();
    void edit_after_the_window_shows_edit_window_expired();
    void reacting_past_20_emoji_shows_invalid_argument();
    void edit_queued_behind_a_recall_shows_already_recalled();
    // rate limits (issue 52)
    void send_a_burst_shows_rate_limited_and_every_message_ends_sent_once();
    // Files (obligation 17, dl50; docs/demo-app.md "Files").
    void attached_file_shows_its_upload_then_arrives_and_saves_the_same_bytes();
    // Files, the QA controls (demo50; docs/demo-app.md "Files: QA controls").
    void upload_limit_setting_paces_the_upload_and_the_file_arrives_intact();
    void close_socket_mid_upload_resumes_from_the_servers_offset();
    void restart_mid_upload_resumes_the_upload_from_the_durable_outbox();
    void corrupt_next_chunk_shows_digest_mismatch_and_the_file_still_arrives_once();
    void damaged_store_copy_shows_failed_digest_mismatch_and_nothing_arrives();

private:
    void clickConversation(ChatWindow *w, const QString &conv);
    void typeAndSend(ChatWindow *w, const QString &text, bool useEnter = false);
    void waitConnected(ChatWindow *w);
    void ensureBen();
    void clearServerFaults();
    QString watchLostReply(ChatWindow *w, const QString &body);
    // replies, edits, reactions
    void triggerRowAction(ChatWindow *w, int modelRow, const QString &action, QString *text = nullptr);
    void clickChip(ChatWindow *w, int modelRow, const QString &emoji);
    qint64 sentSeq(ChatWindow *w, const QString &body);
    QString editWindow(const QString &conv, qint64 ms);
    void expectLostReplySettledOnce(const QString &body);
    // files: ana attaches `size` bytes to ana-ben with `body` (the
    // Attach button's call); the bytes; the cmid in *cmid.
    QByteArray attachToBen(const QString &name, qsizetype size, const QString &body, QString *cmid);
    // ana's `cmid` is Sent with a seq, ben's row of that seq has exactly one
    // file, and ben's Save writes exactly `bytes`.
    void expectArrivedIntact(const QString &cmid, const QByteArray &bytes);

    std::unique_ptr<RealServer> server_;
    std::unique_ptr<WindowManager> manager_;
    QTemporaryDir data_;
    QPointer<ChatWindow> ana_;
    QPointer<ChatWindow> ben_;
};

void TestDemoApp::initTestCase() {
    const QString bin = qEnvironmentVariable("IMSERVER_BIN");
    QVERIFY2(!bin.isEmpty(), "IMSERVER_BIN is not set (ctest sets it)");
    server_ = std::make_unique<RealServer>(bin);
    server_->serverArgs << QStringLiteral("--enable-faults"); // the fault panel arms server faults
    const QString err = server_->start();
    QVERIFY2(err.isEmpty(), qPrintable(err));

    AppOptions opts;
    QString tokErr;
    QVERIFY2(opts.tokens.load(server_->tokenFile, &tokErr), qPrintable(tokErr));
    opts.servers = {server_->url};
    opts.dataDir = data_.path();
    manager_ = std::make_unique<WindowManager>(opts);

    // What main() does for --user ana.
    const DemoUser *ana = opts.tokens.find(QStringLiteral("ana"));
    QVERIFY(ana);
    Session s;
    s.token = ana->token;
    s.user = ana->user;
    s.device = ana->device;
    ana_ = manager_->openWindow(s);
    QVERIFY(ana_);
    QVERIFY(QTest::qWaitForWindowExposed(ana_));
    // Short request timeout so lost replies are retried quickly.
    child<QSpinBox>(ana_, "timeoutSpin")->setValue(1500);
    QCOMPARE(ana_->client()->requestTimeout(), 1500);
}

// Each test can run alone or in any order (`tst_demoapp TESTNAME`): the
// starting state is rebuilt here, not left behind by an earlier test.
void TestDemoApp::init() {
    QVERIFY(ana_);
    if (ana_->clientFaults()->isOffline())
        ana_->clientFaults()->setOffline(false);
    // QA controls back to the SDK's defaults, straight to the server.
    ana_->settingsPanel()->restoreDefaults();
    ana_->faultPanel()->setRouted(false);
    // No reply / edit left half composed by a failed test.
    for (ChatWindow *w : {ana_.data(), ben_.data()})
        if (w)
            child<MessageActions>(w, "messageActions")->cancelCompose();
    clearServerFaults();
    waitConnected(ana_);
    QTRY_COMPARE_WITH_TIMEOUT(ana_->client()->pendingCount(), 0, kSettle);
}

void TestDemoApp::clearServerFaults() {
    FaultClient fc;
    QSignalSpy answered(&fc, &FaultClient::answered);
    fc.post(server_->url, QStringLiteral("off"));
    QTRY_COMPARE_WITH_TIMEOUT(answered.size(), 1, 10000);
    QCOMPARE(answered.at(0).at(0).toInt(), 200);
}

// ben's window, opened as main() would when a test needs ben and the
// sign-in dialog test has not (yet) opened one.
void TestDemoApp::ensureBen() {
    if (ben_)
        return;
    AppOptions opts;
    QString tokErr;
    QVERIFY2(opts.tokens.load(server_->tokenFile, &tokErr), qPrintable(tokErr));
    const DemoUser *ben = opts.tokens.find(QStringLiteral("ben"));
    QVERIFY(ben);
    Session s;
    s.token = ben->token;
    s.user = ben->user;
    s.device = ben->device;
    ben_ = manager_->openWindow(s);
    ensureBen();
    QVERIFY(ben_);
    QVERIFY(QTest::qWaitForWindowExposed(ben_));
    child<QSpinBox>(ben_, "timeoutSpin")->setValue(1500);
    waitConnected(ben_);
}

void TestDemoApp::cleanupTestCase() {
    manager_.reset();
    if (server_)
        server_->stop();
}

void TestDemoApp::waitConnected(ChatWindow *w) {
    QTRY_VERIFY_WITH_TIMEOUT(w->client()->connectionState() == im::ConnectionState::Connected, kSettle);
    QTRY_VERIFY_WITH_TIMEOUT(!w->client()->gatewayId().isEmpty(), kSettle);
}

void TestDemoApp::clickConversation(ChatWindow *w, const QString &conv) {
    QTRY_VERIFY_WITH_TIMEOUT(w->conversations()->indexOf(conv) >= 0, kSettle);
    auto *view = child<QTableView>(w, "convView");
    const int row = w->conversations()->indexOf(conv);
    const QRect rect = view->visualRect(view->model()->index(row, 0));
    QVERIFY(rect.isValid());
    QTest::mouseClick(view->viewport(), Qt::LeftButton, {}, rect.center());
    QTRY_COMPARE(w->currentConversation(), conv);
    QTRY_COMPARE(w->messages()->conversation(), conv);
}

void TestDemoApp::typeAndSend(ChatWindow *w, const QString &text, bool useEnter) {
    auto *edit = child<QLineEdit>(w, "sendEdit");
    edit->setFocus();
    QTest::keyClicks(edit, text);
    QCOMPARE(edit->text(), text);
    if (useEnter)
        QTest::keyClick(edit, Qt::Key_Return);
    else
        QTest::mouseClick(child<QPushButton>(w, "sendButton"), Qt::LeftButton);
    QVERIFY2(edit->text().isEmpty(), // queued: the box is cleared
             qPrintable(QStringLiteral("not queued: %1").arg(w->statusBar()->currentMessage())));
}

// After a send whose reply is lost: our row (found by its cmid) is Pending
// until the resend with the same cmid is answered, then one Sent row is left.
// Returns the cmid (empty on failure).
QString TestDemoApp::watchLostReply(ChatWindow *w, const QString &body) {
    QString cmid;
    for (int r = 0; r < w->messages()->rowCount(); ++r)
        if (w->messages()->get(r, MessageListModel::BodyRole).toString() == body)
            cmid = w->messages()->get(r, MessageListModel::CmidRole).toString();
    if (cmid.isEmpty() && !QTest::qWaitFor([&] {
            for (int r = 0; r < w->messages()->rowCount(); ++r)
                if (w->messages()->get(r, MessageListModel::BodyRole).toString() == body)
                    cmid = w->messages()->get(r, MessageListModel::CmidRole).toString();
            return !cmid.isEmpty();
        }, kSettle))
        return {};
    if (cmid.isEmpty())
        return {};
    const int first = rowOfCmid(w->messages(), cmid);
    if (first < 0)
        return {};
    const auto firstState = MessageState(w->messages()->get(first, MessageListModel::StateRole).toInt());
    if (firstState != MessageState::Pending && firstState != MessageState::Sent) {
        qWarning("the lost-reply message was neither Pending nor Sent: %s", qPrintable(dump(w->messages(), body)));
        return {};
    }
    // Watch until it settles; note how many rows the body had meanwhile. The
    // push of our own event carries our cmid, so it settles the message
    // itself: the body must never show twice, not even for a moment.
    int most = 0;
    const bool settled = QTest::qWaitFor(
        [&] {
            most = qMax(most, int(rowsWithBody(w->messages(), body).size()));
            const int r = rowOfCmid(w->messages(), cmid);
            const auto st = r < 0 ? MessageState(-1) : MessageState(w->messages()->get(r, MessageListModel::StateRole).toInt());
            return st == MessageState::Sent && rowsWithBody(w->messages(), body).size() == 1;
        },
        kSettle);
    if (!settled || most != 1) {
        qWarning("did not settle once (at most %d rows): %s", most, qPrintable(dump(w->messages(), body)));
        return {};
    }
    qInfo("lost reply: '%s' settled Sent once; rows with that body meanwhile: at most %d", qPrintable(body), most);
    return cmid;
}

// A send whose reply was lost: one Sent row with its cmid and a seq at ana,
// nothing left in the outbox, and exactly one row at ben.
void TestDemoApp::expectLostReplySettledOnce(const QString &body) {
    const QString cmid = watchLostReply(ana_, body);
    QVERIFY(!cmid.isEmpty());
    const int r = rowOf(ana_->messages(), body);
    QCOMPARE(ana_->messages()->get(r, MessageListModel::CmidRole).toString(), cmid);
    QVERIFY(ana_->messages()->get(r, MessageListModel::SeqRole).toLongLong() > 0);
    QCOMPARE(ana_->client()->pendingCount(), 0);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ben_->messages(), body), MessageState::Sent, kSettle);
    QTest::qWait(1000);
    QCOMPARE(rowsWithBody(ana_->messages(), body).size(), 1);
    QCOMPARE(rowsWithBody(ben_->messages(), body).size(), 1);
}

void TestDemoApp::signed_in_window_shows_connected_with_the_gateway_id() {
    waitConnected(ana_);
    auto *label = child<QLabel>(ana_, "connectionLabel");
    QTRY_VERIFY(label->text().contains(QStringLiteral("Connected - gateway ") + ana_->client()->gatewayId()));
    QTRY_COMPARE(ana_->client()->userId(), QStringLiteral("ana"));
    QVERIFY(ana_->windowTitle().contains(QStringLiteral("ana")));
    // The demo conversations arrive in the list.
    QTRY_VERIFY_WITH_TIMEOUT(ana_->conversations()->indexOf(QStringLiteral("ana-ben")) >= 0, kSettle);
    QTRY_VERIFY_WITH_TIMEOUT(ana_->conversations()->indexOf(QStringLiteral("team")) >= 0, kSettle);
}

void TestDemoApp::sign_in_dialog_opens_a_second_window_as_another_user() {
    QSignalSpy opened(manager_.get(), &WindowManager::windowOpened);
    const qsizetype before = manager_->windows().size();
    auto *action = ana_->findChild<QAction *>(QStringLiteral("openAnotherAction"));
    QVERIFY(action);
    action->trigger();
    SignInDialog *dialog = nullptr;
    QTRY_VERIFY((dialog = ana_->findChild<SignInDialog *>()) != nullptr);
    QTRY_VERIFY(dialog->isVisible());
    auto *users = child<QListWidget>(dialog, "userList");
    QCOMPARE(users->count(), 3);
    QVERIFY(users->item(0)->text().contains(QStringLiteral("window open"))); // ana is open
    // Pick cy with the mouse (nobody else opens a window for cy), then sign in.
    int cyRow = -1;
    for (int i = 0; i < users->count(); ++i)
        if (users->item(i)->data(Qt::UserRole).toString() == QLatin1String("cy"))
            cyRow = i;
    QVERIFY(cyRow >= 0);
    QVERIFY(!users->item(cyRow)->text().contains(QStringLiteral("window open")));
    QTest::mouseClick(users->viewport(), Qt::LeftButton, {}, users->visualItemRect(users->item(cyRow)).center());
    QCOMPARE(users->currentRow(), cyRow);
    auto *box = dialog->findChild<QDialogButtonBox *>();
    QVERIFY(box);
    auto *ok = box->button(QDialogButtonBox::Ok);
    QTest::mouseClick(ok, Qt::LeftButton);
    QTRY_COMPARE(opened.size(), 1);
    QPointer<ChatWindow> cy = opened.at(0).at(0).value<ChatWindow *>();
    QVERIFY(cy);
    QVERIFY(QTest::qWaitForWindowExposed(cy));
    waitConnected(cy);
    QTRY_COMPARE(cy->client()->userId(), QStringLiteral("cy"));
    // Each window has its own client and its own SQLite file.
    QVERIFY(cy->client() != ana_->client());
    QVERIFY(cy->client()->databasePath() != ana_->client()->databasePath());
    QCOMPARE(manager_->windows().size(), before + 1);
}

void TestDemoApp::typed_message_shows_sent_with_a_seq_on_both_sides() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    clickConversation(ben_, QStringLiteral("ana-ben"));
    const QString body = QStringLiteral("hello ben, typed in the send box");
    typeAndSend(ana_, body);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), body), MessageState::Sent, kSettle);
    const qint64 seq = ana_->messages()->get(rowOf(ana_->messages(), body), MessageListModel::SeqRole).toLongLong();
    QVERIFY(seq > 0);
    QCOMPARE(shown(ana_, body, ChatWindow::StateColumn), QStringLiteral("Sent"));
    QCOMPARE(shown(ana_, body, ChatWindow::SeqColumn), QString::number(seq));
    QCOMPARE(shown(ana_, body, ChatWindow::SenderColumn), QStringLiteral("ana (you)"));
    QCOMPARE(shown(ana_, body, ChatWindow::DupColumn), QString());
    // The other side converges on the same seq.
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ben_->messages(), body), MessageState::Sent, kSettle);
    QCOMPARE(ben_->messages()->get(rowOf(ben_->messages(), body), MessageListModel::SeqRole).toLongLong(), seq);
    QCOMPARE(shown(ben_, body, ChatWindow::SenderColumn), QStringLiteral("ana"));
}

void TestDemoApp::offline_send_shows_pending_then_sent_exactly_once() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    auto *offline = child<QPushButton>(ana_, "offlineButton");
    QCOMPARE(offline->text(), QStringLiteral("Go offline"));
    QTest::mouseClick(offline, Qt::LeftButton);
    QTRY_VERIFY(ana_->clientFaults()->isOffline());
    QTRY_COMPARE(ana_->client()->connectionState(), im::ConnectionState::Disconnected);
    QTRY_VERIFY(child<QLabel>(ana_, "connectionLabel")->text().contains(QStringLiteral("Offline")));
    QCOMPARE(offline->text(), QStringLiteral("Go online"));

    const QString body = QStringLiteral("written while offline");
    typeAndSend(ana_, body, /*useEnter=*/true);
    QTRY_COMPARE(stateOf(ana_->messages(), body), MessageState::Pending);
    QCOMPARE(shown(ana_, body, ChatWindow::StateColumn), QStringLiteral("Pending"));
    QCOMPARE(shown(ana_, body, ChatWindow::SeqColumn), QStringLiteral("-"));
    const QString cmid = ana_->messages()->get(rowOf(ana_->messages(), body), MessageListModel::CmidRole).toString();
    QVERIFY(!cmid.isEmpty());
    // The outbox panel lists it.
    auto *outbox = child<QTableView>(ana_, "outboxView");
    QTRY_COMPARE(outbox->model()->rowCount(), 1);
    QCOMPARE(outbox->model()->index(0, ChatWindow::OCmid).data().toString(), cmid);
    QVERIFY(child<QLabel>(ana_, "outboxDepth")->text().contains(QStringLiteral("<b>1</b>")));
    // Still pending a while later; ben has nothing.
    QTest::qWait(1000);
    QCOMPARE(stateOf(ana_->messages(), body), MessageState::Pending);
    QCOMPARE(rowsWithBody(ben_->messages(), body).size(), 0);

    QTest::mouseClick(offline, Qt::LeftButton); // Go online
    QTRY_VERIFY(!ana_->clientFaults()->isOffline());
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), body), MessageState::Sent, kSettle);
    QCOMPARE(shown(ana_, body, ChatWindow::StateColumn), QStringLiteral("Sent"));
    QCOMPARE(ana_->messages()->get(rowOf(ana_->messages(), body), MessageListModel::CmidRole).toString(), cmid);
    QTRY_COMPARE(outbox->model()->rowCount(), 0);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ben_->messages(), body), MessageState::Sent, kSettle);
    // Exactly once, on both sides, and it stays that way.
    QTest::qWait(1500);
    QCOMPARE(rowsWithBody(ana_->messages(), body).size(), 1);
    QCOMPARE(rowsWithBody(ben_->messages(), body).size(), 1);
    QCOMPARE(ben_->messages()->get(rowOf(ben_->messages(), body), MessageListModel::SeqRole),
             ana_->messages()->get(rowOf(ana_->messages(), body), MessageListModel::SeqRole));
}

void TestDemoApp::unread_count_rises_and_falls_when_the_conversation_is_viewed() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ben_, QStringLiteral("team"));
    QTRY_COMPARE_WITH_TIMEOUT(unreadOf(ben_, QStringLiteral("team")), 0, kSettle);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    const QString body = QStringLiteral("ben, this waits for you");
    typeAndSend(ana_, body);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), body), MessageState::Sent, kSettle);
    // ben looks at team: ana-ben shows an unread count in the list.
    QTRY_VERIFY_WITH_TIMEOUT(unreadOf(ben_, QStringLiteral("ana-ben")) >= 1, kSettle);
    auto *convView = child<QTableView>(ben_, "convView");
    const int row = ben_->conversations()->indexOf(QStringLiteral("ana-ben"));
    QCOMPARE(convView->model()->index(row, 1).data().toLongLong(), unreadOf(ben_, QStringLiteral("ana-ben")));
    // Viewing it advances the read marker (markRead) and clears the count.
    clickConversation(ben_, QStringLiteral("ana-ben"));
    QTRY_COMPARE_WITH_TIMEOUT(unreadOf(ben_, QStringLiteral("ana-ben")), 0, kSettle);
    const int r = ben_->conversations()->indexOf(QStringLiteral("ana-ben"));
    QTRY_COMPARE_WITH_TIMEOUT(ben_->conversations()->get(r, ConversationListModel::ReadRole).toLongLong(),
                              ben_->conversations()->get(r, ConversationListModel::HeadRole).toLongLong(), kSettle);
}

void TestDemoApp::client_dropped_reply_settles_sent_once_with_the_same_cmid() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ben_, QStringLiteral("ana-ben")); // ben's view shows it (also when run alone)
    clickConversation(ana_, QStringLiteral("ana-ben"));
    // Let the markers and acks of opening the conversation settle, so that
    // the next reply the client sees is the send's.
    QTRY_COMPARE_WITH_TIMEOUT(ana_->conversations()->get(ana_->conversations()->indexOf(QStringLiteral("ana-ben")),
                                                         ConversationListModel::UnreadRole).toLongLong(),
                              0, kSettle);
    QSignalSpy dropped(ana_->clientFaults(), &im::testing::Faults::replyDropped);
    QTest::mouseClick(child<QPushButton>(ana_, "dropReplyButton"), Qt::LeftButton);
    const QString body = QStringLiteral("my reply gets lost on the client");
    typeAndSend(ana_, body);
    expectLostReplySettledOnce(body);
    // The reply lost was the send's, not another request's that happened to
    // be answered first (the push of our own event would settle it anyway).
    QCOMPARE(dropped.size(), 1);
    QCOMPARE(dropped.at(0).at(1).toString(), QStringLiteral("sent"));
}

void TestDemoApp::server_fault_drop_reply_settles_sent_once() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    armServerFault(ana_, QStringLiteral("api.after_send_commit"), QStringLiteral("drop_reply"), 1);
    auto *answer = child<QLabel>(ana_, "faultAnswer");
    QTRY_VERIFY_WITH_TIMEOUT(answer->text().startsWith(QStringLiteral("HTTP 200 armed")), 10000);
    QVERIFY(answer->text().contains(QStringLiteral("api.after_send_commit=drop_reply:1")));

    const qint64 droppedBefore = metric(server_->url, kDroppedSends);
    QVERIFY(droppedBefore >= 0);
    const QString body = QStringLiteral("the server drops my reply after commit");
    typeAndSend(ana_, body);
    expectLostReplySettledOnce(body);
    // The reply really was dropped (once), and the armed count is used up.
    QCOMPARE(metric(server_->url, kDroppedSends), droppedBefore + 1);
}

void TestDemoApp::fault_panel_shows_the_servers_answer_to_a_bad_fault_spec() {
    auto *action = child<QComboBox>(ana_, "faultAction");
    action->setCurrentText(QString());
    QTest::keyClicks(action->lineEdit(), QStringLiteral("explode"));
    QTest::mouseClick(child<QPushButton>(ana_, "armFaultButton"), Qt::LeftButton);
    auto *answer = child<QLabel>(ana_, "faultAnswer");
    QTRY_VERIFY_WITH_TIMEOUT(answer->text().startsWith(QStringLiteral("HTTP 400")), 10000);
    QVERIFY(answer->text().contains(QStringLiteral("unknown fault action")));
    QTest::mouseClick(child<QPushButton>(ana_, "clearFaultsButton"), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(answer->text().startsWith(QStringLiteral("HTTP 200 cleared")), 10000);
    action->setCurrentIndex(action->findText(QStringLiteral("drop_reply")));
}

// A server without --enable-faults answers 404 on /lab/fault; a stand-in
// HTTP server checks the request the panel sends and the summary it shows.
void TestDemoApp::fault_client_posts_to_lab_fault_and_reads_404_as_faults_disabled() {
    QCOMPARE(FaultClient::labUrl(QUrl(QStringLiteral("ws://10.0.0.7:8080/v1/ws"))),
             QUrl(QStringLiteral("http://10.0.0.7:8080/lab/fault")));
    QCOMPARE(FaultClient::spec(QStringLiteral("store.before_commit"), QStringLiteral("delay:500"), 3),
             QStringLiteral("store.before_commit=delay:500:3"));
    QCOMPARE(FaultClient::spec(QStringLiteral("api.after_send_commit"), QStringLiteral("drop_reply"), 0),
             QStringLiteral("api.after_send_commit=drop_reply"));
    QTcpServer http;
    QVERIFY(http.listen(QHostAddress::LocalHost, 0));
    QByteArray request;
    connect(&http, &QTcpServer::newConnection, this, [&] {
        QTcpSocket *s = http.nextPendingConnection();
        connect(s, &QTcpSocket::readyRead, s, [s, &request] {
            request += s->readAll();
            if (request.contains("\r\n\r\n") && request.endsWith("drop_reply")) {
                s->write("HTTP/1.1 404 Not Found\r\nContent-Length: 10\r\nConnection: close\r\n\r\nnot found\n");
                s->disconnectFromHost();
            }
        });
    });
    FaultClient client;
    QSignalSpy answered(&client, &FaultClient::answered);
    client.post(QUrl(QStringLiteral("ws://127.0.0.1:%1/v1/ws").arg(http.serverPort())),
                QStringLiteral("api.after_send_commit=drop_reply"));
    QTRY_COMPARE_WITH_TIMEOUT(answered.size(), 1, 10000);
    QVERIFY(request.startsWith("POST /lab/fault HTTP/1.1"));
    QCOMPARE(answered.at(0).at(0).toInt(), 404);
    QVERIFY(answered.at(0).at(1).toString().contains(QStringLiteral("faults are disabled")));
}

void TestDemoApp::recall_from_the_context_menu_shows_recalled_on_both_sides() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    const QString body = QStringLiteral("oops, I take this back");
    typeAndSend(ana_, body);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), body), MessageState::Sent, kSettle);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ben_->messages(), body), MessageState::Sent, kSettle);

    auto *view = child<QTableView>(ana_, "messageView");
    const int row = viewRow(ana_, rowOf(ana_->messages(), body));
    view->scrollTo(view->model()->index(row, 0));
    const QPoint pos = view->visualRect(view->model()->index(row, ChatWindow::BodyColumn)).center();
    bool triggered = false;
    QString actionText;
    QTimer::singleShot(100, this, [&] {
        auto *menu = qobject_cast<QMenu *>(QApplication::activePopupWidget());
        if (!menu)
            return;
        if (auto *recall = menu->findChild<QAction *>(QStringLiteral("recallAction"))) {
            actionText = recall->text();
            if (recall->isEnabled()) {
                recall->trigger();
                triggered = true;
            }
        }
        menu->close();
    });
    QContextMenuEvent event(QContextMenuEvent::Mouse, pos, view->viewport()->mapToGlobal(pos));
    QApplication::sendEvent(view->viewport(), &event); // opens the menu (nested loop until closed)
    QVERIFY2(triggered, qPrintable(QStringLiteral("recall action: '%1'").arg(actionText)));
    QVERIFY(actionText.startsWith(QStringLiteral("Recall (seq ")));

    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), body), MessageState::Recalled, kSettle);
    QCOMPARE(shown(ana_, body, ChatWindow::StateColumn), QStringLiteral("Recalled"));
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ben_->messages(), body), MessageState::Recalled, kSettle);
    QCOMPARE(shown(ben_, body, ChatWindow::StateColumn), QStringLiteral("Recalled"));
    QTRY_COMPARE(ana_->client()->pendingCount(), 0);
}

// A message on the wire when the socket goes (the server holds it 3 s, so
// its reply cannot come back on that connection): after the reconnect it
// ends Sent, once, at both ends, and the outbox is empty.
void TestDemoApp::close_socket_now_reconnects_and_the_outbox_drains() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ben_, QStringLiteral("ana-ben"));
    clickConversation(ana_, QStringLiteral("ana-ben"));
    waitConnected(ana_);
    QTRY_COMPARE(ana_->client()->pendingCount(), 0);
    armServerFault(ana_, QStringLiteral("store.before_insert"), QStringLiteral("delay:3000"), 1);
    QTRY_VERIFY_WITH_TIMEOUT(child<QLabel>(ana_, "faultAnswer")->text().startsWith(QStringLiteral("HTTP 200 armed")),
                             10000);
    const QString body = QStringLiteral("on the wire when the socket closed");
    typeAndSend(ana_, body);
    auto *outbox = child<QTableView>(ana_, "outboxView");
    QTRY_COMPARE(outbox->model()->index(0, ChatWindow::OInFlight).data().toString(), QStringLiteral("yes"));
    QSignalSpy states(ana_->client(), &im::Client::connectionStateChanged);
    QTest::mouseClick(child<QPushButton>(ana_, "closeSocketButton"), Qt::LeftButton);
    QTRY_VERIFY(!states.isEmpty());
    QVERIFY(states.first().first().value<im::ConnectionState>() != im::ConnectionState::Connected);
    waitConnected(ana_);
    QTRY_VERIFY(child<QLabel>(ana_, "connectionLabel")->text().contains(QStringLiteral("Connected - gateway")));
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), body), MessageState::Sent, kSettle);
    QTRY_COMPARE(ana_->client()->pendingCount(), 0);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ben_->messages(), body), MessageState::Sent, kSettle);
    QCOMPARE(rowsWithBody(ana_->messages(), body).size(), 1);
    QCOMPARE(rowsWithBody(ben_->messages(), body).size(), 1);
}

// The outbox panel: "Cancel selected" withdraws a Pending entry that never
// went on the wire (gone from the outbox table and the timeline, never seen
// by the server), and refuses one already sent.
void TestDemoApp::outbox_panel_cancels_a_pending_entry_and_refuses_one_on_the_wire() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ben_, QStringLiteral("ana-ben"));
    clickConversation(ana_, QStringLiteral("ana-ben"));
    const QString db = ana_->session().dbPath;
    auto *offline = child<QPushButton>(ana_, "offlineButton");
    QTest::mouseClick(offline, Qt::LeftButton);
    QTRY_VERIFY(ana_->clientFaults()->isOffline());

    const QString body = QStringLiteral("cancel me before I leave");
    typeAndSend(ana_, body);
    QTRY_COMPARE(stateOf(ana_->messages(), body), MessageState::Pending);
    const QString cmid = ana_->messages()->get(rowOf(ana_->messages(), body), MessageListModel::CmidRole).toString();
    auto *outbox = child<QTableView>(ana_, "outboxView");
    QTRY_COMPARE(outbox->model()->rowCount(), 1);
    QCOMPARE(outbox->model()->index(0, ChatWindow::OCmid).data().toString(), cmid);
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM outbox WHERE cmid = ?"), {cmid}).toInt(), 1);
    outbox->setCurrentIndex(outbox->model()->index(0, 0));
    QTest::mouseClick(child<QPushButton>(ana_, "cancelOutboxButton"), Qt::LeftButton);
    QVERIFY2(ana_->lastActionText().startsWith(QStringLiteral("Cancelled")), qPrintable(ana_->lastActionText()));
    QCOMPARE(outbox->model()->rowCount(), 0);
    QTRY_COMPARE(rowsWithBody(ana_->messages(), body).size(), 0);
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM outbox WHERE cmid = ?"), {cmid}).toInt(), 0);
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM local_messages WHERE cmid = ?"), {cmid}).toInt(), 0);

    // Back online: the next message arrives, the cancelled one never does
    // (one conversation is sent in order, so it would have come first).
    QTest::mouseClick(offline, Qt::LeftButton);
    QTRY_VERIFY(!ana_->clientFaults()->isOffline());
    const QString after = QStringLiteral("sent after the cancel");
    typeAndSend(ana_, after);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ben_->messages(), after), MessageState::Sent, kSettle);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), after), MessageState::Sent, kSettle);
    QCOMPARE(ben_->messages()->get(rowOf(ben_->messages(), after), MessageListModel::SeqRole),
             ana_->messages()->get(rowOf(ana_->messages(), after), MessageListModel::SeqRole));
    QCOMPARE(rowsWithBody(ben_->messages(), body).size(), 0);
    QCOMPARE(rowsWithBody(ana_->messages(), body).size(), 0);

    // On the wire (the server holds the insert 3 s): refused, kept, delivered.
    armServerFault(ana_, QStringLiteral("store.before_insert"), QStringLiteral("delay:3000"), 1);
    QTRY_VERIFY_WITH_TIMEOUT(child<QLabel>(ana_, "faultAnswer")->text().startsWith(QStringLiteral("HTTP 200 armed")),
                             10000);
    const QString sent = QStringLiteral("already on the wire");
    typeAndSend(ana_, sent);
    QTRY_COMPARE(outbox->model()->rowCount(), 1);
    QTRY_VERIFY(ana_->outbox()->get(0, im::OutboxModel::AttemptsRole).toInt() >= 1);
    outbox->setCurrentIndex(outbox->model()->index(0, 0));
    QTest::mouseClick(child<QPushButton>(ana_, "cancelOutboxButton"), Qt::LeftButton);
    QVERIFY2(ana_->lastActionText().contains(QStringLiteral("already sent")), qPrintable(ana_->lastActionText()));
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), sent), MessageState::Sent, kSettle);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ben_->messages(), sent), MessageState::Sent, kSettle);
    QTRY_COMPARE(outbox->model()->rowCount(), 0);
}

// Pipelining in the outbox panel: the server holds the first message's
// insert 3 s; the second goes on the wire behind it, and its "After (prev)"
// column names the first; both are committed in that order.
void TestDemoApp::outbox_panel_shows_what_a_pipelined_message_waits_behind() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ben_, QStringLiteral("ana-ben"));
    clickConversation(ana_, QStringLiteral("ana-ben"));
    armServerFault(ana_, QStringLiteral("store.before_insert"), QStringLiteral("delay:3000"), 1);
    QTRY_VERIFY_WITH_TIMEOUT(child<QLabel>(ana_, "faultAnswer")->text().startsWith(QStringLiteral("HTTP 200 armed")),
                             10000);
    const QString first = QStringLiteral("held by the server"), second = QStringLiteral("pipelined behind it");
    typeAndSend(ana_, first);
    auto *outbox = child<QTableView>(ana_, "outboxView");
    QTRY_COMPARE(outbox->model()->rowCount(), 1);
    QTRY_COMPARE(outbox->model()->index(0, ChatWindow::OInFlight).data().toString(), QStringLiteral("yes"));
    typeAndSend(ana_, second);
    QTRY_COMPARE(outbox->model()->rowCount(), 2);
    QTRY_COMPARE(outbox->model()->index(1, ChatWindow::OInFlight).data().toString(), QStringLiteral("yes"));
    const QString firstCmid = outbox->model()->index(0, ChatWindow::OCmid).data().toString();
    QCOMPARE(outbox->model()->index(0, ChatWindow::OPrev).data().toString(), QStringLiteral("-"));
    QCOMPARE(outbox->model()->index(1, ChatWindow::OPrev).data().toString(), firstCmid.left(8));
    QVERIFY(outbox->model()->index(1, ChatWindow::OPrev).data(Qt::ToolTipRole).toString().contains(firstCmid));
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ben_->messages(), second), MessageState::Sent, kSettle);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), second), MessageState::Sent, kSettle);
    QTRY_COMPARE(outbox->model()->rowCount(), 0);
    const auto seqOf = [&](const QString &body) {
        return ben_->messages()->get(rowOf(ben_->messages(), body), MessageListModel::SeqRole).toLongLong();
    };
    QCOMPARE(seqOf(second), seqOf(first) + 1);
}

// "Discard" on a Failed message (a conversation ana is not in: NOT_MEMBER)
// removes it from the view and the local store; on a Sent one it refuses.
void TestDemoApp::discard_removes_a_failed_message_from_the_view_and_the_store() {
    const QString db = ana_->session().dbPath;
    auto *view = child<QTableView>(ana_, "messageView");
    // Discard refuses a message that is not Failed/Expired: a Sent one stays
    // in the view and the store.
    clickConversation(ana_, QStringLiteral("ana-ben"));
    const QString kept = QStringLiteral("sent, so never discarded");
    typeAndSend(ana_, kept);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), kept), MessageState::Sent, kSettle);
    const int keptRow = rowOf(ana_->messages(), kept);
    const QString keptCmid = ana_->messages()->get(keptRow, MessageListModel::CmidRole).toString();
    view->setCurrentIndex(view->model()->index(viewRow(ana_, keptRow), ChatWindow::BodyColumn));
    QTest::mouseClick(child<QPushButton>(ana_, "discardButton"), Qt::LeftButton);
    QVERIFY2(ana_->lastActionText().startsWith(QStringLiteral("Not discarded")), qPrintable(ana_->lastActionText()));
    QCOMPARE(rowsWithBody(ana_->messages(), kept).size(), 1);
    QCOMPARE(stateOf(ana_->messages(), kept), MessageState::Sent);
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM local_messages WHERE cmid = ?"), {keptCmid}).toInt(), 1);
    ana_->selectConversation(QStringLiteral("nobody-asked-me"));
    QTRY_COMPARE(ana_->messages()->conversation(), QStringLiteral("nobody-asked-me"));
    const QString body = QStringLiteral("this one fails");
    typeAndSend(ana_, body);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), body), MessageState::Failed, kSettle);
    QCOMPARE(shown(ana_, body, ChatWindow::StateColumn), QStringLiteral("Failed: NOT_MEMBER"));
    const int row = rowOf(ana_->messages(), body);
    const QString cmid = ana_->messages()->get(row, MessageListModel::CmidRole).toString();
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM local_messages WHERE cmid = ?"), {cmid}).toInt(), 1);
    // No selection: nothing changes.
    view->setCurrentIndex(QModelIndex());
    QTest::mouseClick(child<QPushButton>(ana_, "discardButton"), Qt::LeftButton);
    QCOMPARE(rowsWithBody(ana_->messages(), body).size(), 1);
    view->setCurrentIndex(view->model()->index(viewRow(ana_, row), ChatWindow::BodyColumn));
    QTest::mouseClick(child<QPushButton>(ana_, "discardButton"), Qt::LeftButton);
    QVERIFY2(ana_->lastActionText().startsWith(QStringLiteral("Discarded")), qPrintable(ana_->lastActionText()));
    QTRY_COMPARE(rowsWithBody(ana_->messages(), body).size(), 0);
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM local_messages WHERE cmid = ?"), {cmid}).toInt(), 0);
    QCOMPARE(ana_->client()->pendingCount(), 0);
    clickConversation(ana_, QStringLiteral("ana-ben"));
}

// History window view: ana comes back after more than the backlog limit of
// ben's messages; the conversation opens with its newest window and a gap
// row; "Fill gap" loads it window by window (the seqs are the server's);
// "Load older" pages older rows into a small window.
// search: obligation 18 through the demo app's search box (issue 51).
void TestDemoApp::search_box_highlights_jumps_to_the_message_and_loads_what_is_missing() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    const QString mine = QStringLiteral("searchable kiwi 会议纪要 draft");
    QVERIFY(!ana_->client()->send(QStringLiteral("ana-ben"), mine).isEmpty()); // QTest types ASCII only
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), mine), MessageState::Sent, kSettle);
    const qint64 seq = ana_->messages()->get(rowOf(ana_->messages(), mine), MessageListModel::SeqRole).toLongLong();

    // Typed into the box: found by a prefix and a two-character Chinese
    // substring, the matches in bold.
    SearchPanel *panel = ana_->searchPanel();
    auto *box = child<QLineEdit>(ana_, "searchBox");
    box->setFocus();
    box->clear();
    QTest::keyClicks(box, QStringLiteral("KIW ")); // QTest types ASCII only:
    QInputMethodEvent ime;                          // Chinese comes from an input method
    ime.setCommitString(QStringLiteral("纪要"));
    QCoreApplication::sendEvent(box, &ime);
    QCOMPARE(box->text(), QStringLiteral("KIW 纪要"));
    QTRY_VERIFY_WITH_TIMEOUT(!panel->model()->isSearching() && panel->model()->count() == 1, kSettle);
    QCOMPARE(panel->model()->result(0).seq(), seq);
    QVERIFY2(panel->snippetHtml(0).contains(QStringLiteral("<b>kiw</b>i")), qPrintable(panel->snippetHtml(0)));
    QVERIFY2(panel->snippetHtml(0).contains(QStringLiteral("会议<b>纪要</b>")), qPrintable(panel->snippetHtml(0)));
    QTRY_VERIFY(child<QLabel>(ana_, "searchStatus")->text().contains(QStringLiteral("1 result")));

    // Activated from another conversation: its conversation shows, the
    // message selected.
    clickConversation(ana_, QStringLiteral("team"));
    auto *results = child<QListView>(ana_, "searchResults");
    results->setFocus();
    results->setCurrentIndex(panel->model()->index(0));
    QTest::keyClick(results, Qt::Key_Return);
    QTRY_COMPARE(ana_->currentConversation(), QStringLiteral("ana-ben"));
    QTRY_COMPARE(ana_->messagePanel()->selectedSeq(), seq);

    // History ana's store skipped (a newest window after a long absence):
    // the notice names the conversation; its button loads the rest, and
    // the results follow.
    child<QSpinBox>(ana_, "backlogLimitSpin")->setValue(5);
    child<QSpinBox>(ana_, "historyWindowSpin")->setValue(4);
    auto *offline = child<QPushButton>(ana_, "offlineButton");
    QTest::mouseClick(offline, Qt::LeftButton);
    QTRY_VERIFY(ana_->clientFaults()->isOffline());
    constexpr int n = 12;
    for (int i = 1; i <= n; ++i)
        QVERIFY(!ben_->client()->send(QStringLiteral("ana-ben"), QStringLiteral("pomelo %1 柚子").arg(i)).isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(ben_->client()->pendingCount(), 0, kSettle);
    QTest::mouseClick(offline, Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(rowsWithBody(ana_->messages(), QStringLiteral("pomelo 12 柚子")).size(), 1, kSettle);
    box->clear();
    QTest::keyClicks(box, QStringLiteral("pomelo"));
    auto *notice = child<QLabel>(ana_, "searchNotice");
    auto *load = child<QPushButton>(ana_, "searchLoadMissing");
    QTRY_VERIFY_WITH_TIMEOUT(!panel->model()->isSearching()
                                 && panel->model()->incompleteConversations().contains(QStringLiteral("ana-ben")),
                             kSettle);
    QVERIFY(panel->model()->count() < n);
    QVERIFY2(notice->isVisible() && notice->text().contains(QStringLiteral("ana-ben")), qPrintable(notice->text()));
    QVERIFY(load->isVisible());
    for (int round = 0; round < 10 && !panel->model()->incompleteConversations().isEmpty(); ++round) {
        const int before = panel->model()->count();
        QTest::mouseClick(load, Qt::LeftButton);
        QTRY_VERIFY_WITH_TIMEOUT(!panel->model()->isSearching()
                                     && (panel->model()->count() > before
                                         || panel->model()->incompleteConversations().isEmpty()),
                                 kSettle);
    }
    QTRY_COMPARE_WITH_TIMEOUT(panel->model()->count(), n, kSettle);
    QTRY_VERIFY(!load->isVisible());
    QVERIFY(notice->text().isEmpty());
    box->clear();
}

void TestDemoApp::history_view_shows_a_gap_fills_it_and_loads_older() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ben_, QStringLiteral("ana-ben"));
    clickConversation(ana_, QStringLiteral("ana-ben"));
    // Something stored below the gap, so the gap is a row.
    const QString before = QStringLiteral("before the gap");
    typeAndSend(ana_, before);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), before), MessageState::Sent, kSettle);
    child<QSpinBox>(ana_, "backlogLimitSpin")->setValue(5);
    child<QSpinBox>(ana_, "historyWindowSpin")->setValue(4);
    auto *offline = child<QPushButton>(ana_, "offlineButton");
    QTest::mouseClick(offline, Qt::LeftButton);
    QTRY_VERIFY(ana_->clientFaults()->isOffline());

    constexpr int n = 12;
    auto body = [](int i) { return QStringLiteral("while ana was away %1").arg(i); };
    for (int i = 1; i <= n; ++i)
        QVERIFY(!ben_->client()->send(QStringLiteral("ana-ben"), body(i)).isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(ben_->client()->pendingCount(), 0, kSettle);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ben_->messages(), body(n)), MessageState::Sent, kSettle);
    QList<qint64> seqs{0};
    for (int i = 1; i <= n; ++i)
        seqs << ben_->messages()->get(rowOf(ben_->messages(), body(i)), MessageListModel::SeqRole).toLongLong();

    auto gapRows = [this] {
        QList<int> rows;
        for (int r = 0; r < ana_->messages()->rowCount(); ++r)
            if (ana_->messages()->get(r, MessageListModel::KindRole).toString() == QLatin1String("gap"))
                rows << r;
        return rows;
    };
    QTest::mouseClick(offline, Qt::LeftButton); // back: the newest window only, and a gap
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), body(n)), MessageState::Sent, kSettle);
    QTRY_COMPARE(gapRows().size(), 1);
    for (int i = n - 3; i <= n; ++i)
        QCOMPARE(ana_->messages()->get(rowOf(ana_->messages(), body(i)), MessageListModel::SeqRole).toLongLong(),
                 seqs[i]);
    QCOMPARE(rowsWithBody(ana_->messages(), body(n - 4)).size(), 0);
    int gap = gapRows().first();
    QCOMPARE(ana_->messages()->get(gap, MessageListModel::GapToRole).toLongLong(), seqs[n - 4]);
    QVERIFY(ana_->messages()->get(gap, MessageListModel::GapFromRole).toLongLong() <= seqs[1]);
    auto *view = child<QTableView>(ana_, "messageView");
    QCOMPARE(view->model()->index(viewRow(ana_, gap), ChatWindow::StateColumn).data().toString(), QStringLiteral("Gap"));
    QVERIFY(view->model()->index(viewRow(ana_, gap), ChatWindow::BodyColumn).data().toString().contains(QStringLiteral("gap")));

    // Fill gap (the gap row selected): the next window down, then the rest.
    auto *fill = child<QPushButton>(ana_, "fillGapButton");
    QVERIFY(fill->isEnabled());
    view->setCurrentIndex(view->model()->index(viewRow(ana_, gap), ChatWindow::BodyColumn));
    QTest::mouseClick(fill, Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(rowsWithBody(ana_->messages(), body(n - 4)).size(), 1, kSettle);
    QCOMPARE(rowsWithBody(ana_->messages(), body(n - 8)).size(), 0);
    QTRY_COMPARE(gapRows().size(), 1);
    QCOMPARE(ana_->messages()->get(gapRows().first(), MessageListModel::GapToRole).toLongLong(), seqs[n - 8]);
    for (int round = 0; round < 5 && !gapRows().isEmpty(); ++round) {
        QTest::mouseClick(fill, Qt::LeftButton); // no selection: the newest gap
        const qint64 to = gapRows().isEmpty() ? 0 : ana_->messages()->get(gapRows().first(), MessageListModel::GapToRole).toLongLong();
        QTRY_VERIFY_WITH_TIMEOUT(gapRows().isEmpty()
                                     || ana_->messages()->get(gapRows().first(), MessageListModel::GapToRole).toLongLong() < to,
                                 kSettle);
    }
    QVERIFY(gapRows().isEmpty());
    QVERIFY(!fill->isEnabled());
    for (int i = 1; i <= n; ++i) {
        QCOMPARE(rowsWithBody(ana_->messages(), body(i)).size(), 1);
        QCOMPARE(ana_->messages()->get(rowOf(ana_->messages(), body(i)), MessageListModel::SeqRole).toLongLong(), seqs[i]);
    }
    QCOMPARE(rowsWithBody(ana_->messages(), before).size(), 1);

    // Load older: a 3-row window shows the newest 3 (the model newest first;
    // the view shows them at the bottom), each click 3 more older ones.
    child<QSpinBox>(ana_, "windowRowsSpin")->setValue(3);
    ana_->selectConversation(QStringLiteral("nobody-asked-me"));
    clickConversation(ana_, QStringLiteral("ana-ben"));
    QTRY_COMPARE(ana_->messages()->rowCount(), 3);
    QCOMPARE(ana_->messages()->get(0, MessageListModel::SeqRole).toLongLong(), seqs[n]);
    auto *older = child<QPushButton>(ana_, "loadOlderButton");
    QTRY_VERIFY(older->isEnabled());
    QTest::mouseClick(older, Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(ana_->messages()->rowCount(), 6, kSettle);
    QCOMPARE(ana_->messages()->get(5, MessageListModel::SeqRole).toLongLong(), seqs[n - 5]);
    QCOMPARE(ana_->messages()->get(0, MessageListModel::SeqRole).toLongLong(), seqs[n]);

    // Back to the defaults for the other tests.
    child<QSpinBox>(ana_, "windowRowsSpin")->setValue(50);
    child<QSpinBox>(ana_, "backlogLimitSpin")->setValue(1000);
    child<QSpinBox>(ana_, "historyWindowSpin")->setValue(100);
    ana_->selectConversation(QStringLiteral("nobody-asked-me"));
    clickConversation(ana_, QStringLiteral("ana-ben"));
}

// The message view is the timeline upside down (the SDK's
// im::ReversedProxyModel): newest at the bottom, followed while the view is
// there, with a window that stays at its size as messages arrive; the view
// never loads history by itself; a scroll to the top by the user loads one
// window of older rows, which stay while messages arrive, and a scroll back
// to the bottom returns to the newest window.
void TestDemoApp::message_view_shows_the_newest_at_the_bottom_and_loads_older_on_a_scroll_to_the_top() {
    ensureBen();
    QVERIFY(ben_);
    const QString conv = QStringLiteral("ana-ben");
    auto body = [](int i) { return QStringLiteral("bottom-up %1").arg(i); };
    constexpr int n = 70, window = 30;
    for (int i = 1; i <= n; ++i)
        QVERIFY(!ben_->client()->send(conv, body(i)).isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(ben_->client()->pendingCount(), 0, kSettle);
    child<QSpinBox>(ana_, "windowRowsSpin")->setValue(window);
    ana_->selectConversation(QStringLiteral("nobody-asked-me"));
    clickConversation(ana_, conv);
    MessageListModel *msgs = ana_->messages();
    QTRY_COMPARE_WITH_TIMEOUT(rowsWithBody(msgs, body(n)).size(), 1, kSettle);
    QTRY_COMPARE(msgs->rowCount(), window);
    auto *view = child<QTableView>(ana_, "messageView");
    QScrollBar *sb = view->verticalScrollBar();
    auto text = [view](int row) { return view->model()->index(row, ChatWindow::BodyColumn).data().toString(); };
    const int last = view->model()->rowCount() - 1;
    QCOMPARE(last, window - 1);
    QCOMPARE(text(last), body(n));               // newest at the bottom
    QCOMPARE(text(0), body(n - window + 1));     // the window's oldest at the top
    QTRY_VERIFY(sb->maximum() > sb->minimum());  // more rows than the view shows (laid out)
    QTRY_COMPARE(sb->value(), sb->maximum());    // opened at the bottom
    QVERIFY(msgs->isFollowingNewest());

    // A message arrives: the bottom row, followed; the window keeps its size.
    QVERIFY(!ben_->client()->send(conv, body(n + 1)).isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(text(view->model()->rowCount() - 1), body(n + 1), kSettle);
    QCOMPARE(msgs->rowCount(), window);
    QTRY_COMPARE(sb->value(), sb->maximum());
    QCOMPARE(text(0), body(n - window + 2));

    // The user scrolls to the top: one window of older rows, above.
    sb->triggerAction(QAbstractSlider::SliderToMinimum);
    QTRY_COMPARE_WITH_TIMEOUT(msgs->rowCount(), 2 * window, kSettle);
    QVERIFY(!msgs->isFollowingNewest());
    QCOMPARE(text(0), body(n - 2 * window + 2));
    // A message arrives meanwhile: added at the bottom, nothing dropped.
    QVERIFY(!ben_->client()->send(conv, body(n + 2)).isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(text(view->model()->rowCount() - 1), body(n + 2), kSettle);
    QCOMPARE(msgs->rowCount(), 2 * window + 1);
    QCOMPARE(text(0), body(n - 2 * window + 2));

    // Back at the bottom: the newest window again.
    sb->triggerAction(QAbstractSlider::SliderToMaximum);
    QTRY_COMPARE(msgs->rowCount(), window);
    QVERIFY(msgs->isFollowingNewest());
    QCOMPARE(text(window - 1), body(n + 2));
    QCOMPARE(text(0), body(n - window + 3));

    child<QSpinBox>(ana_, "windowRowsSpin")->setValue(50);
    ana_->selectConversation(QStringLiteral("nobody-asked-me"));
    clickConversation(ana_, conv);
}

// Obligation 14 for QA: the connection panel counts down to the token's
// expiry (a JWT's `exp`), shows when the client asks for a new token, and a
// pasted token ends a rejection: no reconnect meanwhile, nothing lost.
void TestDemoApp::token_panel_shows_the_expiry_and_recovers_from_a_rejected_token() {
    waitConnected(ana_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    auto *expiry = child<QLabel>(ana_, "tokenExpiryLabel");
    auto *asked = child<QLabel>(ana_, "credentialsLabel");
    auto *edit = child<QLineEdit>(ana_, "newTokenEdit");
    auto *use = child<QPushButton>(ana_, "useTokenButton");
    const QString good = ana_->session().token;
    QVERIFY2(expiry->text().contains(QStringLiteral("unknown")), qPrintable(expiry->text())); // a device token

    // A token of the shape of a JWT, 40 s before its exp: the field counts
    // down from its `exp`, and the client asks at once (less than 90 s left).
    auto b64 = [](const QByteArray &json) {
        return QString::fromLatin1(json.toBase64(QByteArray::Base64UrlEncoding | QByteArray::OmitTrailingEquals));
    };
    const qint64 exp = QDateTime::currentSecsSinceEpoch() + 40;
    const QString jwt = b64(R"({"alg":"HS256","typ":"JWT"})") + QLatin1Char('.')
                        + b64(QStringLiteral(R"({"sub":"ana","device":"ana-d1","exp":%1})").arg(exp).toUtf8())
                        + QStringLiteral(".c2ln");
    edit->setText(jwt);
    QTest::mouseClick(use, Qt::LeftButton);
    QVERIFY2(expiry->text().startsWith(QStringLiteral("Token expires in ")), qPrintable(expiry->text()));
    const int left = expiry->text().section(QLatin1Char(' '), 3, 3).toInt();
    QVERIFY2(left > 30 && left <= 40, qPrintable(expiry->text()));
    QVERIFY2(asked->text().contains(QStringLiteral("expires soon")), qPrintable(asked->text()));
    QVERIFY(edit->text().isEmpty());

    // A token the server refuses (whatever it made of that unsigned JWT).
    edit->setText(QStringLiteral("not-a-valid-token"));
    QTest::mouseClick(use, Qt::LeftButton);
    if (ana_->client()->connectionState() == im::ConnectionState::Connected)
        QTest::mouseClick(child<QPushButton>(ana_, "closeSocketButton"), Qt::LeftButton); // next hello: refused
    QTRY_VERIFY_WITH_TIMEOUT(asked->text().contains(QStringLiteral("rejected")), kSettle);
    QTRY_COMPARE(expiry->text(), QStringLiteral("Token rejected: paste a new one"));
    QCOMPARE(ana_->client()->connectionState(), im::ConnectionState::Disconnected);
    const QString body = QStringLiteral("written while the token was refused");
    typeAndSend(ana_, body);
    QTest::qWait(1500); // many reconnect backoffs: none is tried
    QCOMPARE(ana_->client()->connectionState(), im::ConnectionState::Disconnected);
    QCOMPARE(stateOf(ana_->messages(), body), MessageState::Pending);

    // Written under a token no welcome proved: held, not just pending.
    QTRY_COMPARE(shown(ana_, body, ChatWindow::StateColumn), QStringLiteral("Held"));

    // The good token again, as the same person (obligation 10: only then do
    // the refused token's drafts go with it): reconnects, and the message
    // goes, once.
    child<QCheckBox>(ana_, "sameUserCheck")->setChecked(true);
    edit->setText(good);
    QTest::keyClick(edit, Qt::Key_Return);
    QVERIFY(!child<QCheckBox>(ana_, "sameUserCheck")->isChecked()); // one hand-over only
    waitConnected(ana_);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), body), MessageState::Sent, kSettle);
    QCOMPARE(rowsWithBody(ana_->messages(), body).size(), 1);
    QTRY_VERIFY(expiry->text().contains(QStringLiteral("unknown")));
}

// Obligation 10 in the demo: offline, ana writes a draft (Pending); then
// ben's token is pasted into ana's window and a second draft is written
// under it. The message view shows it "Held" beside ana's "Pending", the
// outbox panel marks it held and counts it; "Discard held drafts" drops it
// (and only it). ana's token back: her draft goes, ben's never does.
void TestDemoApp::held_drafts_show_apart_from_pending_and_are_discarded() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    clickConversation(ben_, QStringLiteral("ana-ben"));
    const QString good = ana_->session().token;
    auto *offline = child<QPushButton>(ana_, "offlineButton");
    QTest::mouseClick(offline, Qt::LeftButton);
    QTRY_VERIFY(ana_->clientFaults()->isOffline());
    const QString anas = QStringLiteral("ana's own draft, offline");
    typeAndSend(ana_, anas);
    QTRY_COMPARE(shown(ana_, anas, ChatWindow::StateColumn), QStringLiteral("Pending"));

    auto *edit = child<QLineEdit>(ana_, "newTokenEdit");
    edit->setText(server_->tokens.value(QStringLiteral("ben")));
    QTest::mouseClick(child<QPushButton>(ana_, "useTokenButton"), Qt::LeftButton);
    const QString bens = QStringLiteral("ben's draft in ana's window");
    typeAndSend(ana_, bens);
    QTRY_COMPARE(shown(ana_, bens, ChatWindow::StateColumn), QStringLiteral("Held"));
    QCOMPARE(shown(ana_, anas, ChatWindow::StateColumn), QStringLiteral("Pending"));
    QCOMPARE(stateOf(ana_->messages(), bens), MessageState::Pending); // the state itself: not sent

    // Apart (issue 48): the outbox table lists what goes out, ana's draft
    // only; the held draft is in a table of its own, shown while there is one.
    auto *outbox = child<QTableView>(ana_, "outboxView");
    auto *heldView = child<QTableView>(ana_, "heldView");
    auto *heldBox = child<QWidget>(ana_, "heldBox");
    QTRY_COMPARE(heldView->model()->rowCount(), 1);
    QCOMPARE(outbox->model()->rowCount(), 1);
    QCOMPARE(outbox->model()->index(0, ChatWindow::OWhat).data().toString(), anas);
    QCOMPARE(outbox->model()->index(0, ChatWindow::OHeld).data().toString(), QStringLiteral("-"));
    QCOMPARE(heldView->model()->index(0, ChatWindow::OWhat).data().toString(), bens);
    QCOMPARE(heldView->model()->index(0, ChatWindow::OHeld).data().toString(), QStringLiteral("held"));
    QVERIFY(heldBox->isVisible());
    QVERIFY(heldBox->isAncestorOf(child<QPushButton>(ana_, "discardHeldButton")));
    auto *depth = child<QLabel>(ana_, "outboxDepth");
    QVERIFY2(depth->text().contains(QStringLiteral("held: <b>1</b>")), qPrintable(depth->text()));

    QTest::mouseClick(child<QPushButton>(ana_, "discardHeldButton"), Qt::LeftButton);
    QCOMPARE(ana_->lastActionText(), QStringLiteral("Discarded 1 held draft(s)"));
    QTRY_COMPARE(heldView->model()->rowCount(), 0);
    QTRY_VERIFY(!heldBox->isVisible());
    QCOMPARE(outbox->model()->rowCount(), 1);
    QCOMPARE(outbox->model()->index(0, ChatWindow::OWhat).data().toString(), anas);
    QVERIFY2(!depth->text().contains(QStringLiteral("held")), qPrintable(depth->text()));
    QTRY_COMPARE(rowsWithBody(ana_->messages(), bens).size(), 0);

    edit->setText(good);
    QTest::mouseClick(child<QPushButton>(ana_, "useTokenButton"), Qt::LeftButton);
    QTest::mouseClick(offline, Qt::LeftButton); // Go online
    QTRY_VERIFY(!ana_->clientFaults()->isOffline());
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), anas), MessageState::Sent, kSettle);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ben_->messages(), anas), MessageState::Sent, kSettle);
    QCOMPARE(rowsWithBody(ben_->messages(), bens).size(), 0);
    QCOMPARE(ana_->client()->heldCount(), 0);
}

// Connect / Disconnect (issue 48): Disconnect closes the connection and
// stops reconnecting (the indicator says Disconnected, Connect is offered);
// a message typed meanwhile waits Pending; Connect connects again and it
// goes out once.
void TestDemoApp::disconnect_and_connect_buttons_drive_the_client() {
    waitConnected(ana_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    auto *connectButton = child<QPushButton>(ana_, "connectButton");
    auto *disconnectButton = child<QPushButton>(ana_, "disconnectButton");
    QTRY_VERIFY(disconnectButton->isEnabled());
    QVERIFY(!connectButton->isEnabled());

    QTest::mouseClick(disconnectButton, Qt::LeftButton);
    QTRY_COMPARE(ana_->client()->connectionState(), im::ConnectionState::Disconnected);
    QTRY_VERIFY(connectButton->isEnabled());
    QVERIFY(!disconnectButton->isEnabled());
    QCOMPARE(ana_->connectionText(), QStringLiteral("Disconnected"));
    const QString body = QStringLiteral("typed while disconnected");
    typeAndSend(ana_, body);
    QTRY_COMPARE(shown(ana_, body, ChatWindow::StateColumn), QStringLiteral("Pending"));
    QCOMPARE(ana_->client()->connectionState(), im::ConnectionState::Disconnected); // no reconnect by itself

    QTest::mouseClick(connectButton, Qt::LeftButton);
    waitConnected(ana_);
    QTRY_VERIFY(disconnectButton->isEnabled());
    QVERIFY(!connectButton->isEnabled());
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), body), MessageState::Sent, kSettle);
    QCOMPARE(rowsWithBody(ana_->messages(), body).size(), 1);
}

// "Reset install" and then Connect, in the same window (issue 48: QA had
// to close it). A second install of ana's device connects (another store,
// same token), which makes ana's window's install stale: after its next
// hello it shows the STALE_INSTALL banner, Connect is not offered (a stale
// install must be reset first). Reset install, Connect: connected again
// under a new install id.
void TestDemoApp::reset_install_then_connect_without_closing_the_window() {
    waitConnected(ana_);
    const QString oldInstall = ana_->client()->installId();
    {
        im::Client other;
        other.setServers({server_->url});
        other.setCredentials(ana_->session().token);
        QVERIFY(other.open(data_.filePath(QStringLiteral("ana-second-install.db"))));
        other.connectToServer();
        QTRY_VERIFY_WITH_TIMEOUT(other.connectionState() == im::ConnectionState::Connected, kSettle);
    }
    // ana's window finds out at its next hello.
    ana_->clientFaults()->closeSocketNow();
    QTRY_VERIFY_WITH_TIMEOUT(ana_->client()->isInstallStale(), kSettle);
    auto *connectButton = child<QPushButton>(ana_, "connectButton");
    auto *reset = child<QPushButton>(ana_, "resetInstallButton");
    QTRY_VERIFY(reset->isVisible());
    QCOMPARE(ana_->client()->connectionState(), im::ConnectionState::Disconnected);
    QVERIFY(!connectButton->isEnabled());

    QTest::mouseClick(reset, Qt::LeftButton);
    QTRY_VERIFY(!ana_->client()->isInstallStale());
    QVERIFY(ana_->client()->installId() != oldInstall);
    QTRY_VERIFY(connectButton->isEnabled());
    QCOMPARE(ana_->client()->connectionState(), im::ConnectionState::Disconnected);
    QTest::mouseClick(connectButton, Qt::LeftButton);
    waitConnected(ana_);
    QVERIFY(!reset->isVisible());
}

// The log pane shows the SDK's im.sdk.* lines as they are written: a
// dropped socket and the reconnect are logged by im.sdk.connection at info
// level; "Debug messages" adds the debug lines (the hello).
void TestDemoApp::log_pane_shows_the_sdks_im_sdk_lines() {
    waitConnected(ana_);
    auto *log = child<QPlainTextEdit>(ana_, "logView");
    QTest::mouseClick(child<QPushButton>(ana_, "clearLogButton"), Qt::LeftButton);
    QCOMPARE(log->toPlainText(), QString());
    QCOMPARE(ana_->logPanel()->lineCount(), 0);
    QTest::mouseClick(child<QPushButton>(ana_, "closeSocketButton"), Qt::LeftButton);
    waitConnected(ana_);
    QTRY_VERIFY2(log->toPlainText().contains(QStringLiteral("info im.sdk.connection connection closed")),
                 qPrintable(log->toPlainText()));
    QTRY_VERIFY2(log->toPlainText().contains(QStringLiteral("info im.sdk.connection welcome: user ana")),
                 qPrintable(log->toPlainText()));
    QVERIFY(!log->toPlainText().contains(QStringLiteral(" debug im.sdk.")));
    // Only im.sdk.* reaches the pane.
    qInfo("not an SDK line: tst_demoapp says hello");
    QVERIFY(!log->toPlainText().contains(QStringLiteral("tst_demoapp says hello")));

    auto *debug = child<QCheckBox>(ana_, "logDebugCheck");
    debug->click();
    QVERIFY(debug->isChecked());
    QTest::mouseClick(child<QPushButton>(ana_, "closeSocketButton"), Qt::LeftButton);
    waitConnected(ana_);
    QTRY_VERIFY2(log->toPlainText().contains(QStringLiteral("debug im.sdk.connection socket open to")),
                 qPrintable(log->toPlainText()));
    debug->click();
    QVERIFY(!debug->isChecked());
    QVERIFY(ana_->logPanel()->lineCount() >= 3);
}

// Send window 1 (Client::setSendWindow through the settings panel): while
// the server holds the first message 3 s, the second waits in the outbox,
// not on the wire (the default window puts both in flight, as in
// outbox_panel_shows_what_a_pipelined_message_waits_behind).
void TestDemoApp::send_window_of_one_keeps_a_single_request_in_flight() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ben_, QStringLiteral("ana-ben"));
    clickConversation(ana_, QStringLiteral("ana-ben"));
    auto *window = child<QSpinBox>(ana_, "sendWindowSpin");
    QCOMPARE(window->value(), SettingsPanel::DefaultSendWindow);
    window->setValue(1);
    QVERIFY(child<QLabel>(ana_, "settingsApplied")->text().contains(QStringLiteral("send window 1,")));
    armServerFault(ana_, QStringLiteral("store.before_insert"), QStringLiteral("delay:3000"), 1);
    QTRY_VERIFY_WITH_TIMEOUT(child<QLabel>(ana_, "faultAnswer")->text().startsWith(QStringLiteral("HTTP 200 armed")),
                             10000);
    const QString first = QStringLiteral("window of one: first"), second = QStringLiteral("window of one: second");
    typeAndSend(ana_, first);
    auto *outbox = child<QTableView>(ana_, "outboxView");
    QTRY_COMPARE(outbox->model()->index(0, ChatWindow::OInFlight).data().toString(), QStringLiteral("yes"));
    typeAndSend(ana_, second);
    QTRY_COMPARE(outbox->model()->rowCount(), 2);
    // Watch until both arrived at ben: never two in flight at once.
    int mostInFlight = 0;
    const bool done = QTest::qWaitFor(
        [&] {
            int n = 0;
            for (int r = 0; r < outbox->model()->rowCount(); ++r)
                if (outbox->model()->index(r, ChatWindow::OInFlight).data().toString() == QLatin1String("yes"))
                    ++n;
            mostInFlight = qMax(mostInFlight, n);
            return stateOf(ben_->messages(), first) == MessageState::Sent
                   && stateOf(ben_->messages(), second) == MessageState::Sent;
        },
        kSettle);
    QVERIFY(done);
    QCOMPARE(mostInFlight, 1);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), second), MessageState::Sent, kSettle);
    const auto seqOf = [&](const QString &body) {
        return ben_->messages()->get(rowOf(ben_->messages(), body), MessageListModel::SeqRole).toLongLong();
    };
    QCOMPARE(seqOf(second), seqOf(first) + 1);
    QTest::mouseClick(child<QPushButton>(ana_, "settingsDefaultsButton"), Qt::LeftButton);
    QCOMPARE(window->value(), SettingsPanel::DefaultSendWindow);
}

// Reconnect backoff 8000..8000 ms (Client::setReconnectBackoff): after a
// dropped socket the next attempt is scheduled 4-8 s ahead (jitter [d/2, d];
// with the default 500 ms it would be at most 0.5 s), the panel counts down
// to it, and the client reconnects then.
void TestDemoApp::reconnect_backoff_setting_shows_in_the_countdown() {
    waitConnected(ana_);
    child<QSpinBox>(ana_, "reconnectMaxSpin")->setValue(8000);
    child<QSpinBox>(ana_, "reconnectInitialSpin")->setValue(8000);
    QVERIFY(child<QLabel>(ana_, "settingsApplied")->text().contains(QStringLiteral("reconnect 8000..8000 ms")));
    QTest::mouseClick(child<QPushButton>(ana_, "closeSocketButton"), Qt::LeftButton);
    QTRY_COMPARE(ana_->client()->connectionState(), im::ConnectionState::Reconnecting);
    const QDateTime at = ana_->client()->nextReconnectAt();
    QVERIFY(at.isValid());
    const qint64 ahead = QDateTime::currentDateTimeUtc().msecsTo(at);
    QVERIFY2(ahead > 2000 && ahead <= 8000, qPrintable(QString::number(ahead)));
    QTRY_VERIFY(child<QLabel>(ana_, "connectionLabel")->text().contains(QStringLiteral("Reconnecting in ")));
    waitConnected(ana_);
}

// Retry backoff 8000..8000 ms (Client::setRetryBackoff): a send the server
// answers UNAVAILABLE is resent 4-8 s later (the outbox's Next retry; with
// the default 250 ms it would be at most 0.25 s ahead); once the fault is
// cleared it goes, once.
void TestDemoApp::retry_backoff_setting_spaces_the_resends() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ben_, QStringLiteral("ana-ben"));
    clickConversation(ana_, QStringLiteral("ana-ben"));
    child<QSpinBox>(ana_, "retryMaxSpin")->setValue(8000);
    child<QSpinBox>(ana_, "retryInitialSpin")->setValue(8000);
    QVERIFY(child<QLabel>(ana_, "settingsApplied")->text().contains(QStringLiteral("retry 8000..8000 ms")));
    armServerFault(ana_, QStringLiteral("store.before_insert"), QStringLiteral("unavailable"), 0);
    QTRY_VERIFY_WITH_TIMEOUT(child<QLabel>(ana_, "faultAnswer")->text().startsWith(QStringLiteral("HTTP 200 armed")),
                             10000);
    const QString body = QStringLiteral("resent after the retry backoff");
    typeAndSend(ana_, body);
    im::OutboxModel *outbox = ana_->outbox();
    QTRY_VERIFY_WITH_TIMEOUT(outbox->rowCount() == 1
                                 && outbox->get(0, im::OutboxModel::LastErrorRole).toString()
                                        == QLatin1String("UNAVAILABLE"),
                             kSettle);
    QCOMPARE(outbox->get(0, im::OutboxModel::AttemptsRole).toInt(), 1);
    const QDateTime next = outbox->get(0, im::OutboxModel::NextRetryAtRole).toDateTime();
    QVERIFY(next.isValid());
    const qint64 ahead = QDateTime::currentDateTimeUtc().msecsTo(next);
    QVERIFY2(ahead > 2000 && ahead <= 8000, qPrintable(QString::number(ahead)));
    QTRY_VERIFY(child<QTableView>(ana_, "outboxView")
                    ->model()
                    ->index(0, ChatWindow::ONextRetry)
                    .data()
                    .toString()
                    .startsWith(QStringLiteral("in ")));
    QTest::mouseClick(child<QPushButton>(ana_, "clearFaultsButton"), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(child<QLabel>(ana_, "faultAnswer")->text().startsWith(QStringLiteral("HTTP 200 cleared")),
                             10000);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), body), MessageState::Sent, kSettle);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ben_->messages(), body), MessageState::Sent, kSettle);
    QCOMPARE(rowsWithBody(ben_->messages(), body).size(), 1);
}

// The silent server: through the local fault proxy, "Silence the server"
// keeps ana's connection open while nothing comes back (no reply, no push,
// no pong). A message sent then stays Pending and never reaches ben while
// that connection lasts; with keepalive 300 ms / 2000 ms the SDK drops it
// ("nothing heard for 2000 ms" in the log pane), reconnects through the
// proxy on a new connection, and the message goes once.
void TestDemoApp::silent_server_keeps_a_send_pending_until_the_keepalive_reconnects() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ben_, QStringLiteral("ana-ben"));
    clickConversation(ana_, QStringLiteral("ana-ben"));
    child<QSpinBox>(ana_, "silenceTimeoutSpin")->setValue(2000);
    child<QSpinBox>(ana_, "pingIntervalSpin")->setValue(300);
    QVERIFY(child<QLabel>(ana_, "settingsApplied")->text().contains(QStringLiteral("ping 300 ms, silence 2000 ms")));

    auto *silence = child<QPushButton>(ana_, "silenceServerButton");
    QVERIFY(!silence->isEnabled());
    child<QCheckBox>(ana_, "routeProxyCheck")->click();
    QVERIFY(ana_->faultPanel()->isRouted());
    QVERIFY(silence->isEnabled());
    FaultProxy *proxy = ana_->faultPanel()->proxies().value(0);
    QVERIFY(proxy);
    QCOMPARE(proxy->upstream(), server_->url);
    QTRY_VERIFY_WITH_TIMEOUT(ana_->client()->connectionState() == im::ConnectionState::Connected
                                 && ana_->client()->currentServer() == proxy->proxiedUrl(),
                             kSettle);
    QCOMPARE(proxy->openConnections(), 1);
    // The lab endpoint is still the real server's, not the proxy's.
    QVERIFY(child<QLabel>(ana_, "labUrlLabel")->text().contains(FaultClient::labUrl(server_->url).toString()));
    const QString through = QStringLiteral("through the proxy");
    typeAndSend(ana_, through);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ben_->messages(), through), MessageState::Sent, kSettle);

    QTest::mouseClick(child<QPushButton>(ana_, "clearLogButton"), Qt::LeftButton);
    const int accepted = proxy->acceptedConnections();
    QTest::mouseClick(silence, Qt::LeftButton);
    QCOMPARE(proxy->silencedConnections(), 1);
    QVERIFY(child<QLabel>(ana_, "proxyLabel")->text().contains(QStringLiteral("1 silenced")));
    const QString body = QStringLiteral("sent to a silent server");
    typeAndSend(ana_, body);
    // While the silenced connection lasts: Pending, nothing at ben.
    bool leaked = false;
    const bool dropped = QTest::qWaitFor(
        [&] {
            if (ana_->client()->connectionState() != im::ConnectionState::Connected)
                return true;
            leaked = leaked || stateOf(ana_->messages(), body) == MessageState::Sent
                     || !rowsWithBody(ben_->messages(), body).isEmpty();
            return false;
        },
        15000); // the keepalive is set to 2 s; the default 25 s would not fire in time
    QVERIFY2(!leaked, qPrintable(QStringLiteral("went through the silent connection: %1 (ben: %2 row(s))")
                                     .arg(dump(ana_->messages(), body))
                                     .arg(rowsWithBody(ben_->messages(), body).size())));
    QVERIFY2(dropped, "the keepalive never dropped the silent connection");
    QTRY_VERIFY2(ana_->logPanel()->text().contains(QStringLiteral("im.sdk.connection nothing heard for 2000 ms")),
                 qPrintable(ana_->logPanel()->text()));

    // A new connection through the proxy (not silenced): the message goes, once.
    waitConnected(ana_);
    QVERIFY(proxy->acceptedConnections() > accepted);
    QCOMPARE(ana_->client()->currentServer(), proxy->proxiedUrl());
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), body), MessageState::Sent, kSettle);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ben_->messages(), body), MessageState::Sent, kSettle);
    QCOMPARE(rowsWithBody(ana_->messages(), body).size(), 1);
    QCOMPARE(rowsWithBody(ben_->messages(), body).size(), 1);
    QTRY_COMPARE(proxy->silencedConnections(), 0); // the client closed the silent one

    // Back to the server itself.
    child<QCheckBox>(ana_, "routeProxyCheck")->click();
    QVERIFY(!ana_->faultPanel()->isRouted());
    QTRY_VERIFY_WITH_TIMEOUT(ana_->client()->connectionState() == im::ConnectionState::Connected
                                 && ana_->client()->currentServer() == server_->url,
                             kSettle);
}

void TestDemoApp::screenshot_of_the_main_window_is_saved() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ben_, QStringLiteral("ana-ben")); // also when run alone (demo_screenshot)
    clickConversation(ana_, QStringLiteral("ana-ben"));
    // Something in the outbox for the picture: the server answers UNAVAILABLE
    // (store.before_insert) until the fault is cleared.
    armServerFault(ana_, QStringLiteral("store.before_insert"), QStringLiteral("unavailable"), 0); // 0: until cleared
    auto *answer = child<QLabel>(ana_, "faultAnswer");
    QTRY_VERIFY_WITH_TIMEOUT(answer->text().startsWith(QStringLiteral("HTTP 200 armed")), 10000);
    const QString body = QStringLiteral("retried while the server says UNAVAILABLE");
    typeAndSend(ana_, body);
    auto *outbox = child<QTableView>(ana_, "outboxView");
    QTRY_VERIFY_WITH_TIMEOUT(outbox->model()->rowCount() == 1
                                 && outbox->model()->index(0, ChatWindow::OLastError).data().toString()
                                        == QLatin1String("UNAVAILABLE")
                                 && outbox->model()->index(0, ChatWindow::OAttempts).data().toInt() >= 3
                                 && outbox->model()->index(0, ChatWindow::ONextRetry).data().toString().startsWith(
                                     QLatin1String("in ")),
                             kSettle);
    QCOMPARE(stateOf(ana_->messages(), body), MessageState::Pending);
    // The message view's columns fit what they show (also when this test
    // runs alone, with few rows that arrived after the window was laid out).
    auto *view = child<QTableView>(ana_, "messageView");
    const int row = viewRow(ana_, rowOf(ana_->messages(), body));
    for (int c : {int(ChatWindow::TimeColumn), int(ChatWindow::SenderColumn), int(ChatWindow::StateColumn)}) {
        const QString text = view->model()->index(row, c).data().toString();
        QTRY_VERIFY2(view->columnWidth(c) > view->fontMetrics().horizontalAdvance(text),
                     qPrintable(QStringLiteral("column %1 is %2 px for \"%3\"")
                                    .arg(c)
                                    .arg(view->columnWidth(c))
                                    .arg(text)));
    }

    ana_->raise();
    const QImage shot = ana_->grab().toImage();
    QVERIFY(!shot.isNull());
    // Into the build tree; `cmake --build build --target demo_screenshot`
    // points IM_DEMO_SCREENSHOT at docs/demo.png to refresh the docs' picture.
    const QString path = qEnvironmentVariable("IM_DEMO_SCREENSHOT", exeRelativePath(IM_DEMO_SCREENSHOT));
    QVERIFY(shot.save(path));
    QVERIFY(QImage(path).size() == shot.size());
    qInfo("screenshot saved to %s (%dx%d)", qPrintable(path), shot.width(), shot.height());

    // Clear the fault: the message settles Sent, once.
    QTest::mouseClick(child<QPushButton>(ana_, "clearFaultsButton"), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(answer->text().startsWith(QStringLiteral("HTTP 200 cleared")), 10000);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), body), MessageState::Sent, 60000);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ben_->messages(), body), MessageState::Sent, kSettle);
    QCOMPARE(rowsWithBody(ben_->messages(), body).size(), 1);
}

// replies, edits, reactions

namespace {

int rowOfSeq(const MessageListModel *model, qint64 seq) {
    for (int r = 0; r < model->rowCount(); ++r)
        if (model->get(r, MessageListModel::SeqRole).toLongLong() == seq)
            return r;
    return -1;
}

/// What the message view shows in `column` (in MessageDelegate's `role`) for
/// the timeline model's row `modelRow`.
QVariant shownAt(ChatWindow *w, int modelRow, int role, int column = ChatWindow::BodyColumn) {
    if (modelRow < 0)
        return QStringLiteral("<no row>");
    auto *view = child<QTableView>(w, "messageView");
    return view->model()->index(viewRow(w, modelRow), column).data(role);
}

QVariant shownAtSeq(ChatWindow *w, qint64 seq, int role) { return shownAt(w, rowOfSeq(w->messages(), seq), role); }

/// The reaction chips the view shows at `seq`: "👍 2 mine" / "👍 1", in order.
QStringList chipsAt(ChatWindow *w, qint64 seq) {
    QStringList out;
    for (const QVariant &v : shownAtSeq(w, seq, MessageDelegate::ReactionsRole).toList()) {
        const QVariantMap r = v.toMap();
        out << MessageDelegate::chipText(r) + (r.value(QStringLiteral("mine")).toBool() ? QStringLiteral(" mine") : QString());
    }
    return out;
}

QString resultText(ChatWindow *w) { return child<QLabel>(w, "changeResultLabel")->text(); }

} // namespace

// Opens the message view's context menu on `modelRow` and triggers the
// action named `action` (also inside the React submenu); fails if it is
// missing or disabled. `text`: the action's text.
void TestDemoApp::triggerRowAction(ChatWindow *w, int modelRow, const QString &action, QString *text) {
    QVERIFY(modelRow >= 0);
    auto *view = child<QTableView>(w, "messageView");
    const QModelIndex index = view->model()->index(viewRow(w, modelRow), ChatWindow::BodyColumn);
    view->scrollTo(index);
    const QPoint pos = view->visualRect(index).center();
    bool found = false, triggered = false;
    QString actionText;
    QTimer::singleShot(100, this, [&] {
        auto *menu = qobject_cast<QMenu *>(QApplication::activePopupWidget());
        if (!menu)
            return;
        if (auto *a = menu->findChild<QAction *>(action)) {
            found = true;
            actionText = a->text();
            QMenu *sub = nullptr;
            for (QWidget *parent = qobject_cast<QWidget *>(a->parent()); parent; parent = parent->parentWidget())
                if ((sub = qobject_cast<QMenu *>(parent)))
                    break;
            if (a->isEnabled() && (!sub || sub == menu || sub->menuAction()->isEnabled())) {
                a->trigger();
                triggered = true;
            }
        }
        menu->close();
    });
    QContextMenuEvent event(QContextMenuEvent::Mouse, pos, view->viewport()->mapToGlobal(pos));
    QApplication::sendEvent(view->viewport(), &event); // opens the menu (nested loop until closed)
    QVERIFY2(found, qPrintable(QStringLiteral("no action %1 in the menu").arg(action)));
    QVERIFY2(triggered, qPrintable(QStringLiteral("action %1 disabled: '%2'").arg(action, actionText)));
    if (text)
        *text = actionText;
}

// Clicks the reaction chip of `emoji` on the view's row of `modelRow`.
void TestDemoApp::clickChip(ChatWindow *w, int modelRow, const QString &emoji) {
    QVERIFY(modelRow >= 0);
    auto *view = child<QTableView>(w, "messageView");
    auto *delegate = w->findChild<MessageDelegate *>(QStringLiteral("messageDelegate"));
    QVERIFY(delegate);
    const QModelIndex index = view->model()->index(viewRow(w, modelRow), ChatWindow::BodyColumn);
    // The row grows to hold its chips (resized once per event loop turn),
    // and the view may have to scroll to show it whole.
    QTRY_VERIFY((view->scrollTo(index), view->visualRect(index).contains(delegate->chipRect(view, index, emoji))
                 && view->viewport()->rect().contains(delegate->chipRect(view, index, emoji))));
    QTest::mouseClick(view->viewport(), Qt::LeftButton, {}, delegate->chipRect(view, index, emoji).center());
}

// Waits until the row of `body` is Sent at `w`; its seq (0 on failure).
qint64 TestDemoApp::sentSeq(ChatWindow *w, const QString &body) {
    if (!QTest::qWaitFor([&] { return stateOf(w->messages(), body) == MessageState::Sent; }, kSettle))
        return 0;
    return w->messages()->get(rowOf(w->messages(), body), MessageListModel::SeqRole).toLongLong();
}

// `imserver admin conv set CONV --edit-window-ms MS` on the test server's
// database (docs/operations.md, "Conversation settings"); empty on success.
QString TestDemoApp::editWindow(const QString &conv, qint64 ms) {
    QProcess admin;
    admin.setProcessChannelMode(QProcess::MergedChannels);
    admin.start(qEnvironmentVariable("IMSERVER_BIN"),
                {QStringLiteral("admin"), QStringLiteral("--db"), server_->dbUrl(), QStringLiteral("conv"),
                 QStringLiteral("set"), conv, QStringLiteral("--edit-window-ms"), QString::number(ms)});
    if (!admin.waitForFinished(60000) || admin.exitStatus() != QProcess::NormalExit || admin.exitCode() != 0)
        return QStringLiteral("admin conv set failed (exit %1): %2")
            .arg(admin.exitCode())
            .arg(QString::fromUtf8(admin.readAll()));
    return {};
}

// Reply from the context menu: the composer says what is answered (and can
// be cancelled); the reply shows the quote (sender: first line) above its
// body at both ends.
void TestDemoApp::reply_from_the_menu_shows_the_quote_on_both_sides() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    clickConversation(ben_, QStringLiteral("ana-ben"));
    const QString question = QStringLiteral("shall we meet at noon? (reply test)");
    typeAndSend(ben_, question);
    const qint64 qseq = sentSeq(ben_, question);
    QVERIFY(qseq > 0);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), question), MessageState::Sent, kSettle);
    auto *bar = child<QWidget>(ana_, "composeBar");
    auto *sendButton = child<QPushButton>(ana_, "sendButton");
    QVERIFY(!bar->isVisible());

    // Reply, then cancel: the next message is a plain one.
    QString text;
    triggerRowAction(ana_, rowOf(ana_->messages(), question), QStringLiteral("replyAction"), &text);
    QCOMPARE(text, QStringLiteral("Reply (to seq %1)").arg(qseq));
    QTRY_VERIFY(bar->isVisible());
    QCOMPARE(child<QLabel>(ana_, "composeLabel")->text(),
             QStringLiteral("Replying to ben (seq %1): %2").arg(qseq).arg(question));
    QCOMPARE(sendButton->text(), QStringLiteral("Reply"));
    QTest::mouseClick(child<QPushButton>(ana_, "composeCancelButton"), Qt::LeftButton);
    QVERIFY(!bar->isVisible());
    QCOMPARE(sendButton->text(), QStringLiteral("Send"));
    const QString plain = QStringLiteral("not a reply after the cancel");
    typeAndSend(ana_, plain);
    QVERIFY(sentSeq(ana_, plain) > 0);
    QCOMPARE(shownAt(ana_, rowOf(ana_->messages(), plain), MessageDelegate::QuoteRole).toString(), QString());

    // Reply for real (Enter sends it).
    triggerRowAction(ana_, rowOf(ana_->messages(), question), QStringLiteral("replyAction"));
    QTRY_VERIFY(bar->isVisible());
    const QString answer = QStringLiteral("noon works for me");
    typeAndSend(ana_, answer, /*useEnter=*/true);
    QVERIFY(!bar->isVisible());
    const QString quote = QStringLiteral("ben: ") + question;
    // Shown at once (Pending), then Sent; ben sees the same quote.
    QTRY_COMPARE(shownAt(ana_, rowOf(ana_->messages(), answer), MessageDelegate::QuoteRole).toString(), quote);
    const qint64 aseq = sentSeq(ana_, answer);
    QVERIFY(aseq > 0);
    QCOMPARE(ana_->messages()->get(rowOf(ana_->messages(), answer), MessageListModel::ReplyToRole).toLongLong(), qseq);
    QCOMPARE(shownAtSeq(ana_, aseq, MessageDelegate::QuoteRole).toString(), quote);
    QCOMPARE(shownAtSeq(ana_, aseq, Qt::DisplayRole).toString(), answer);
    QTRY_COMPARE_WITH_TIMEOUT(shownAtSeq(ben_, aseq, MessageDelegate::QuoteRole).toString(), quote, kSettle);
    QCOMPARE(shownAtSeq(ben_, aseq, Qt::DisplayRole).toString(), answer);
    // The row is taller than a plain one: the quote line is drawn above the body.
    auto *view = child<QTableView>(ben_, "messageView");
    QTRY_VERIFY(view->rowHeight(viewRow(ben_, rowOfSeq(ben_->messages(), aseq)))
                > view->rowHeight(viewRow(ben_, rowOf(ben_->messages(), plain))));
}

// Edit from the context menu: the composer starts from the current body;
// while offline the new body shows at once with "change pending"; then both
// ends show the new body marked "(edited)", under the same seq.
void TestDemoApp::edit_of_your_message_shows_the_edited_body_on_both_sides() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    clickConversation(ben_, QStringLiteral("ana-ben"));
    const QString body = QStringLiteral("see you at the trian station");
    typeAndSend(ana_, body);
    const qint64 seq = sentSeq(ana_, body);
    QVERIFY(seq > 0);
    QTRY_COMPARE_WITH_TIMEOUT(shownAtSeq(ben_, seq, Qt::DisplayRole).toString(), body, kSettle);
    QCOMPARE(shownAtSeq(ana_, seq, MessageDelegate::EditedMarkRole).toString(), QString());

    ana_->clientFaults()->setOffline(true);
    QTRY_COMPARE(ana_->client()->connectionState(), im::ConnectionState::Disconnected);
    QString text;
    triggerRowAction(ana_, rowOfSeq(ana_->messages(), seq), QStringLiteral("editAction"), &text);
    QCOMPARE(text, QStringLiteral("Edit (seq %1)").arg(seq));
    auto *edit = child<QLineEdit>(ana_, "sendEdit");
    QCOMPARE(edit->text(), body); // starts from the current body
    QVERIFY(child<QLabel>(ana_, "composeLabel")->text().startsWith(QStringLiteral("Editing your message")));
    QCOMPARE(child<QPushButton>(ana_, "sendButton")->text(), QStringLiteral("Save edit"));
    edit->clear();
    const QString fixed = QStringLiteral("see you at the train station");
    typeAndSend(ana_, fixed);
    QVERIFY(!child<QWidget>(ana_, "composeBar")->isVisible());
    // Offline: ours at once, marked pending; ben still has the old body.
    QTRY_COMPARE(shownAtSeq(ana_, seq, Qt::DisplayRole).toString(), fixed);
    QCOMPARE(shownAtSeq(ana_, seq, MessageDelegate::EditedMarkRole).toString(), QStringLiteral("(edited)"));
    QCOMPARE(shownAtSeq(ana_, seq, MessageDelegate::PendingMarkRole).toString(), QStringLiteral("change pending"));
    QCOMPARE(shownAtSeq(ben_, seq, Qt::DisplayRole).toString(), body);

    ana_->clientFaults()->setOffline(false);
    QTRY_VERIFY_WITH_TIMEOUT(resultText(ana_).startsWith(QStringLiteral("Edit of seq %1 (request ").arg(seq)), kSettle);
    QVERIFY2(resultText(ana_).contains(QStringLiteral("): Sent, event seq ")), qPrintable(resultText(ana_)));
    QTRY_COMPARE_WITH_TIMEOUT(shownAtSeq(ana_, seq, MessageDelegate::PendingMarkRole).toString(), QString(), kSettle);
    // (Between the server's answer and the edit event's push the row may show
    // the stored body: docs/sdk.md, "Pending changes".)
    QTRY_COMPARE_WITH_TIMEOUT(shownAtSeq(ana_, seq, Qt::DisplayRole).toString(), fixed, kSettle);
    QCOMPARE(shownAtSeq(ana_, seq, MessageDelegate::EditedMarkRole).toString(), QStringLiteral("(edited)"));
    QTRY_COMPARE_WITH_TIMEOUT(shownAtSeq(ben_, seq, Qt::DisplayRole).toString(), fixed, kSettle);
    QCOMPARE(shownAtSeq(ben_, seq, MessageDelegate::EditedMarkRole).toString(), QStringLiteral("(edited)"));
    QCOMPARE(shownAtSeq(ben_, seq, MessageDelegate::PendingMarkRole).toString(), QString());
    // Still one row each: an edit is no new message.
    QCOMPARE(rowsWithBody(ana_->messages(), fixed).size(), 1);
    QCOMPARE(rowsWithBody(ben_->messages(), fixed).size(), 1);
    QCOMPARE(rowsWithBody(ben_->messages(), body).size(), 0);
}

namespace {

/// The fill colour the view paints inside the chip of `emoji` at `seq`.
QColor chipFill(ChatWindow *w, qint64 seq, const QString &emoji) {
    auto *view = w->findChild<QTableView *>(QStringLiteral("messageView"));
    auto *delegate = w->findChild<MessageDelegate *>(QStringLiteral("messageDelegate"));
    const QModelIndex index = view->model()->index(viewRow(w, rowOfSeq(w->messages(), seq)), ChatWindow::BodyColumn);
    // The row grows to hold its chips (resized once per event loop turn),
    // and the view may have to scroll to show it whole.
    QRect chip;
    if (!QTest::qWaitFor([&] {
            view->scrollTo(index);
            chip = delegate->chipRect(view, index, emoji);
            return !chip.isNull() && view->visualRect(index).contains(chip)
                   && view->viewport()->rect().contains(chip);
        }, 5000)) {
        const QRect cell = view->visualRect(index), port = view->viewport()->rect();
        qWarning("chip %s at seq %lld not shown whole: chip %d,%d %dx%d, cell %d,%d %dx%d, viewport %dx%d",
                 qPrintable(emoji), seq, chip.x(), chip.y(), chip.width(), chip.height(), cell.x(), cell.y(),
                 cell.width(), cell.height(), port.width(), port.height());
        return {};
    }
    const QImage shot = view->viewport()->grab().toImage();
    // Inside the rounded chip, left of its text (which starts 6 px in).
    return shot.pixelColor(chip.left() + 3, chip.center().y());
}

} // namespace

// Reactions: a chip per emoji with its count, ours highlighted (drawn in
// blue); the React menu and a click on a chip add ours, a click on our chip
// removes it; both ends agree.
void TestDemoApp::reactions_show_counts_and_mine_highlighted_on_both_sides_and_unreact() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    clickConversation(ben_, QStringLiteral("ana-ben"));
    const QString body = QStringLiteral("the release is out (reaction test)");
    typeAndSend(ana_, body);
    const qint64 seq = sentSeq(ana_, body);
    QVERIFY(seq > 0);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ben_->messages(), body), MessageState::Sent, kSettle);
    const QString thumbs = MessageActions::quickEmoji().at(0);
    QCOMPARE(thumbs, QStringLiteral("👍"));

    // ana: React > 👍 from the menu.
    QString text;
    triggerRowAction(ana_, rowOfSeq(ana_->messages(), seq), QStringLiteral("reactAction0"), &text);
    QCOMPARE(text, thumbs);
    QTRY_COMPARE(chipsAt(ana_, seq), QStringList{QStringLiteral("👍 1 mine")});
    QTRY_VERIFY_WITH_TIMEOUT(resultText(ana_).contains(QStringLiteral("): Sent, event seq ")), kSettle);
    QTRY_COMPARE_WITH_TIMEOUT(chipsAt(ben_, seq), QStringList{QStringLiteral("👍 1")}, kSettle);
    const QColor mineFill = chipFill(ana_, seq, thumbs), otherFill = chipFill(ben_, seq, thumbs);
    QVERIFY(mineFill.isValid() && otherFill.isValid());
    QVERIFY2(mineFill != otherFill, qPrintable(mineFill.name() + QLatin1Char(' ') + otherFill.name()));
    QVERIFY2(mineFill.blue() > mineFill.red() + 20, qPrintable(mineFill.name())); // highlighted: blue

    // ben clicks the chip: 2, his highlighted; ana's stays hers.
    clickChip(ben_, rowOfSeq(ben_->messages(), seq), thumbs);
    QTRY_COMPARE(chipsAt(ben_, seq), QStringList{QStringLiteral("👍 2 mine")});
    QTRY_COMPARE_WITH_TIMEOUT(chipsAt(ana_, seq), QStringList{QStringLiteral("👍 2 mine")}, kSettle);
    QCOMPARE(chipFill(ben_, seq, thumbs), mineFill);
    // ana adds 🎉 by the menu, the menu now offers to remove her 👍.
    triggerRowAction(ana_, rowOfSeq(ana_->messages(), seq), QStringLiteral("reactAction5"));
    QTRY_COMPARE_WITH_TIMEOUT(chipsAt(ben_, seq), (QStringList{QStringLiteral("👍 2 mine"), QStringLiteral("🎉 1")}),
                              kSettle);
    QTRY_COMPARE(chipsAt(ana_, seq), (QStringList{QStringLiteral("👍 2 mine"), QStringLiteral("🎉 1 mine")}));
    QTRY_COMPARE_WITH_TIMEOUT(shownAtSeq(ana_, seq, MessageDelegate::PendingMarkRole).toString(), QString(), kSettle);
    // Offline, ana removes her 👍 from the menu: the chip changes at once,
    // the row marked pending; ben still counts it.
    ana_->clientFaults()->setOffline(true);
    QTRY_COMPARE(ana_->client()->connectionState(), im::ConnectionState::Disconnected);
    triggerRowAction(ana_, rowOfSeq(ana_->messages(), seq), QStringLiteral("reactAction0"), &text);
    QCOMPARE(text, QStringLiteral("👍 (yours: remove)"));
    // Equal counts: any order.
    auto sorted = [](QStringList l) {
        l.sort();
        return l;
    };
    QTRY_COMPARE(sorted(chipsAt(ana_, seq)), sorted({QStringLiteral("👍 1"), QStringLiteral("🎉 1 mine")}));
    QCOMPARE(shownAtSeq(ana_, seq, MessageDelegate::PendingMarkRole).toString(), QStringLiteral("change pending"));
    QCOMPARE(chipsAt(ben_, seq), (QStringList{QStringLiteral("👍 2 mine"), QStringLiteral("🎉 1")}));
    ana_->clientFaults()->setOffline(false);
    QTRY_COMPARE_WITH_TIMEOUT(sorted(chipsAt(ben_, seq)), sorted({QStringLiteral("👍 1 mine"), QStringLiteral("🎉 1")}),
                              kSettle);
    // ana clicks her 🎉 chip: gone at both ends.
    QTRY_COMPARE_WITH_TIMEOUT(shownAtSeq(ana_, seq, MessageDelegate::PendingMarkRole).toString(), QString(), kSettle);
    clickChip(ana_, rowOfSeq(ana_->messages(), seq), QStringLiteral("🎉"));
    QTRY_COMPARE(chipsAt(ana_, seq), QStringList{QStringLiteral("👍 1")});
    QTRY_COMPARE_WITH_TIMEOUT(chipsAt(ben_, seq), QStringList{QStringLiteral("👍 1 mine")}, kSettle);
    QTRY_COMPARE_WITH_TIMEOUT(shownAtSeq(ana_, seq, MessageDelegate::PendingMarkRole).toString(), QString(), kSettle);
    QCOMPARE(chipFill(ana_, seq, thumbs), otherFill);
    QTRY_COMPARE(ana_->client()->pendingCount(), 0);
}

// QA: editing someone else's message is offered (marked) and the server's
// NOT_SENDER shows; the message keeps its body.
void TestDemoApp::edit_of_another_users_message_shows_not_sender() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    clickConversation(ben_, QStringLiteral("ana-ben"));
    const QString body = QStringLiteral("ben's words, not ana's to edit");
    typeAndSend(ben_, body);
    const qint64 seq = sentSeq(ben_, body);
    QVERIFY(seq > 0);
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), body), MessageState::Sent, kSettle);
    QString text;
    triggerRowAction(ana_, rowOfSeq(ana_->messages(), seq), QStringLiteral("editAction"), &text);
    QCOMPARE(text, QStringLiteral("Edit (seq %1) - not yours: expect NOT_SENDER").arg(seq));
    QVERIFY(child<QLabel>(ana_, "composeLabel")->text().contains(QStringLiteral("NOT_SENDER")));
    auto *edit = child<QLineEdit>(ana_, "sendEdit");
    edit->clear();
    typeAndSend(ana_, QStringLiteral("ana rewrites ben"));
    QTRY_VERIFY_WITH_TIMEOUT(resultText(ana_).startsWith(QStringLiteral("Edit of seq %1 (request ").arg(seq)), kSettle);
    QVERIFY2(resultText(ana_).endsWith(QStringLiteral("): Failed: NOT_SENDER")), qPrintable(resultText(ana_)));
    QVERIFY(ana_->statusBar()->currentMessage().contains(QStringLiteral("NOT_SENDER")));
    // The refused edit is dropped from the row.
    QTRY_COMPARE(shownAtSeq(ana_, seq, Qt::DisplayRole).toString(), body);
    QCOMPARE(shownAtSeq(ana_, seq, MessageDelegate::EditedMarkRole).toString(), QString());
    QCOMPARE(shownAtSeq(ana_, seq, MessageDelegate::PendingMarkRole).toString(), QString());
    QCOMPARE(shownAtSeq(ben_, seq, Qt::DisplayRole).toString(), body);
    QCOMPARE(ana_->client()->pendingCount(), 0);
}

// QA: with the conversation's edit window set to 1 ms (admin CLI), an edit
// of our own message shows EDIT_WINDOW_EXPIRED; the body stays.
void TestDemoApp::edit_after_the_window_shows_edit_window_expired() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    const QString body = QStringLiteral("too late to fix this one");
    typeAndSend(ana_, body);
    const qint64 seq = sentSeq(ana_, body);
    QVERIFY(seq > 0);
    QString err = editWindow(QStringLiteral("ana-ben"), 1);
    QVERIFY2(err.isEmpty(), qPrintable(err));
    struct Restore {
        TestDemoApp *t;
        ~Restore() { t->editWindow(QStringLiteral("ana-ben"), 172800000); } // the default (48 h)
    } restore{this};
    triggerRowAction(ana_, rowOfSeq(ana_->messages(), seq), QStringLiteral("editAction"));
    auto *edit = child<QLineEdit>(ana_, "sendEdit");
    edit->clear();
    typeAndSend(ana_, QStringLiteral("fixed too late"));
    QTRY_VERIFY_WITH_TIMEOUT(resultText(ana_).startsWith(QStringLiteral("Edit of seq %1 (request ").arg(seq)), kSettle);
    QVERIFY2(resultText(ana_).endsWith(QStringLiteral("): Failed: EDIT_WINDOW_EXPIRED")), qPrintable(resultText(ana_)));
    QTRY_COMPARE(shownAtSeq(ana_, seq, Qt::DisplayRole).toString(), body);
    QCOMPARE(shownAtSeq(ana_, seq, MessageDelegate::EditedMarkRole).toString(), QString());
    QCOMPARE(ana_->client()->pendingCount(), 0);
    err = editWindow(QStringLiteral("ana-ben"), 172800000);
    QVERIFY2(err.isEmpty(), qPrintable(err));
}

// QA: "react with 21 distinct emoji" queues 21 reactions of ours; the 21st
// shows the server's INVALID_ARGUMENT, 20 chips stay ours.
void TestDemoApp::reacting_past_20_emoji_shows_invalid_argument() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    clickConversation(ben_, QStringLiteral("ana-ben"));
    const QString body = QStringLiteral("react to this a lot");
    typeAndSend(ana_, body);
    const qint64 seq = sentSeq(ana_, body);
    QVERIFY(seq > 0);
    triggerRowAction(ana_, rowOfSeq(ana_->messages(), seq), QStringLiteral("reactManyAction"));
    QTRY_VERIFY_WITH_TIMEOUT(resultText(ana_).startsWith(QStringLiteral("21 distinct reactions on seq %1: ").arg(seq)),
                             60000);
    QCOMPARE(resultText(ana_),
             QStringLiteral("21 distinct reactions on seq %1: 20 Sent, 1 Failed: INVALID_ARGUMENT").arg(seq));
    QTRY_COMPARE(chipsAt(ana_, seq).size(), 20);
    for (const QString &chip : chipsAt(ana_, seq))
        QVERIFY2(chip.endsWith(QStringLiteral(" 1 mine")), qPrintable(chip));
    QVERIFY(!chipsAt(ana_, seq).contains(MessageActions::manyEmoji().at(20) + QStringLiteral(" 1 mine")));
    QTRY_COMPARE_WITH_TIMEOUT(chipsAt(ben_, seq).size(), 20, kSettle);
    QCOMPARE(ana_->client()->pendingCount(), 0);
}

// QA: offline, a recall and then an edit of the same message are queued;
// online the recall goes first and the edit shows ALREADY_RECALLED.
void TestDemoApp::edit_queued_behind_a_recall_shows_already_recalled() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    const QString body = QStringLiteral("recalled before the edit lands");
    typeAndSend(ana_, body);
    const qint64 seq = sentSeq(ana_, body);
    QVERIFY(seq > 0);
    ana_->clientFaults()->setOffline(true);
    QTRY_COMPARE(ana_->client()->connectionState(), im::ConnectionState::Disconnected);
    triggerRowAction(ana_, rowOfSeq(ana_->messages(), seq), QStringLiteral("recallAction"));
    triggerRowAction(ana_, rowOfSeq(ana_->messages(), seq), QStringLiteral("editAction"));
    auto *edit = child<QLineEdit>(ana_, "sendEdit");
    edit->clear();
    typeAndSend(ana_, QStringLiteral("an edit after the recall"));
    QTRY_COMPARE(ana_->client()->pendingCount(), 2);
    ana_->clientFaults()->setOffline(false);
    QTRY_VERIFY_WITH_TIMEOUT(resultText(ana_).startsWith(QStringLiteral("Edit of seq %1 (request ").arg(seq)), kSettle);
    QVERIFY2(resultText(ana_).endsWith(QStringLiteral("): Failed: ALREADY_RECALLED")), qPrintable(resultText(ana_)));
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ana_->messages(), body), MessageState::Recalled, kSettle);
    QCOMPARE(shownAtSeq(ana_, seq, MessageDelegate::EditedMarkRole).toString(), QString());
    QCOMPARE(ana_->client()->pendingCount(), 0);
}

// typing and presence (contract section 13, obligation 19)

// ana types in the send box without sending: ben's window shows "ana is
// typing…" under its timeline; ana empties the box: it goes; ana types
// again and sends: it goes with the message.
void TestDemoApp::typing_in_the_send_box_shows_is_typing_under_the_other_timeline() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    clickConversation(ben_, QStringLiteral("ana-ben"));
    auto *bar = child<QLabel>(ben_, "typingBar");
    auto *anaBar = child<QLabel>(ana_, "typingBar");
    QVERIFY(bar->isVisible());
    QCOMPARE(bar->text(), QString());
    auto *edit = child<QLineEdit>(ana_, "sendEdit");
    edit->setFocus();
    QTest::keyClicks(edit, QStringLiteral("hel"));
    QTRY_COMPARE_WITH_TIMEOUT(bar->text(), QStringLiteral("ana is typing…"), kSettle);
    QCOMPARE(anaBar->text(), QString()); // not shown to the typist
    // Under the timeline: below the message view, inside the message panel.
    auto *view = child<QTableView>(ben_, "messageView");
    QVERIFY(bar->mapTo(ben_, QPoint(0, 0)).y() >= view->mapTo(ben_, QPoint(0, view->height())).y());
    // Emptied box: typing stops (an on:false, a second after the first frame at most).
    edit->selectAll();
    QTest::keyClick(edit, Qt::Key_Backspace);
    QVERIFY(edit->text().isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(bar->text(), QString(), kSettle);
    // Typing again, then the send: gone with the message.
    const QString body = QStringLiteral("typed, then sent");
    QTRY_VERIFY_WITH_TIMEOUT(!ana_->client()->isTyping(QStringLiteral("ana-ben")), kSettle);
    QTest::qWait(1100); // a fresh second of the 2-a-second typing limit
    QTest::keyClicks(edit, body);
    QTRY_COMPARE_WITH_TIMEOUT(bar->text(), QStringLiteral("ana is typing…"), kSettle);
    QTest::keyClick(edit, Qt::Key_Return);
    QVERIFY(edit->text().isEmpty());
    QVERIFY(!ana_->client()->isTyping(QStringLiteral("ana-ben")));
    QTRY_COMPARE_WITH_TIMEOUT(stateOf(ben_->messages(), body), MessageState::Sent, kSettle);
    QTRY_COMPARE_WITH_TIMEOUT(bar->text(), QString(), kSettle);
}

// ana's conversation panel lists ben (her direct conversation's peer) with
// a green dot while ben's window is connected, "last seen" once he
// disconnects, online again after Connect; a user typed into "Watch user"
// who shares nothing with ana stays unknown.
void TestDemoApp::people_list_shows_online_dots_and_last_seen() {
    ensureBen();
    QVERIFY(ben_);
    waitConnected(ben_);
    auto *list = child<QListWidget>(ana_, "presenceList");
    const auto rowOfUser = [list](const QString &user) -> QListWidgetItem * {
        for (int i = 0; i < list->count(); ++i)
            if (list->item(i)->data(PresenceList::UserRole).toString() == user)
                return list->item(i);
        return nullptr;
    };
    const auto online = [&](const QString &user) {
        QListWidgetItem *it = rowOfUser(user);
        return it && it->data(PresenceList::OnlineRole).toBool();
    };
    QTRY_VERIFY_WITH_TIMEOUT(online(QStringLiteral("ben")), kSettle);
    QVERIFY(rowOfUser(QStringLiteral("ben"))->text().contains(QStringLiteral("online")));

    auto *disconnectButton = child<QPushButton>(ben_, "disconnectButton");
    QTRY_VERIFY(disconnectButton->isEnabled());
    QTest::mouseClick(disconnectButton, Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(rowOfUser(QStringLiteral("ben")) && !online(QStringLiteral("ben")), kSettle);
    QVERIFY2(rowOfUser(QStringLiteral("ben"))->text().contains(QStringLiteral("last seen")),
             qPrintable(rowOfUser(QStringLiteral("ben"))->text()));
    QTest::mouseClick(child<QPushButton>(ben_, "connectButton"), Qt::LeftButton);
    waitConnected(ben_);
    QTRY_VERIFY_WITH_TIMEOUT(online(QStringLiteral("ben")), kSettle);

    auto *watch = child<QLineEdit>(ana_, "watchUserEdit");
    watch->setFocus();
    QTest::keyClicks(watch, QStringLiteral("zed"));
    QTest::keyClick(watch, Qt::Key_Return);
    QTRY_VERIFY(rowOfUser(QStringLiteral("zed")) != nullptr);
    QTest::qWait(500); // the server's answer leaves zed out: still unknown after it
    QVERIFY(!rowOfUser(QStringLiteral("zed"))->data(PresenceList::KnownRole).toBool());
    QVERIFY(rowOfUser(QStringLiteral("zed"))->text().contains(QStringLiteral("unknown")));
}

// The fault panel's "Send a burst" against a server of its own with limits
// (the shared one runs unlimited for the other tests): 80 sends at once
// past --send-burst 20 at --send-rate 20, so most are answered RATE_LIMITED
// (with the defaults, burst 60, a slow machine sends the 80 slowly enough
// for the bucket to refill and none is refused). The Outbox panel shows that as their last error while they
// wait; the SDK resends them with the same cmid after retry_ms, and every
// message of the burst ends Sent exactly once, in the order clicked.
void TestDemoApp::send_a_burst_shows_rate_limited_and_every_message_ends_sent_once() {
    RealServer limited(qEnvironmentVariable("IMSERVER_BIN"));
    limited.serverArgs << QStringLiteral("--send-rate") << QStringLiteral("20") << QStringLiteral("--send-burst")
                       << QStringLiteral("20");
    const QString err = limited.start();
    QVERIFY2(err.isEmpty(), qPrintable(err));
    QTemporaryDir dataDir;
    AppOptions opts;
    QString tokErr;
    QVERIFY2(opts.tokens.load(limited.tokenFile, &tokErr), qPrintable(tokErr));
    opts.servers = {limited.url};
    opts.dataDir = dataDir.path();
    WindowManager manager(opts);
    const DemoUser *ana = opts.tokens.find(QStringLiteral("ana"));
    QVERIFY(ana);
    Session session;
    session.token = ana->token;
    session.user = ana->user;
    session.device = ana->device;
    session.dbPath = dataDir.filePath(QStringLiteral("burst-ana.db"));
    QPointer<ChatWindow> w = manager.openWindow(session);
    QVERIFY(w);
    QVERIFY(QTest::qWaitForWindowExposed(w));
    waitConnected(w);
    clickConversation(w, QStringLiteral("ana-ben"));

    // What the Outbox panel shows while the burst drains: any row whose last
    // error column says RATE_LIMITED (looked at every 10 ms).
    auto *outbox = child<QTableView>(w, "outboxView");
    int limitedRowsSeen = 0;
    QTimer watch;
    watch.setInterval(10);
    connect(&watch, &QTimer::timeout, this, [&] {
        int n = 0;
        for (int r = 0; r < outbox->model()->rowCount(); ++r) {
            const QString e = outbox->model()->index(r, ChatWindow::OLastError).data().toString();
            if (e == u"RATE_LIMITED")
                ++n;
        }
        limitedRowsSeen = std::max(limitedRowsSeen, n);
    });
    watch.start();
    const qint64 limitedBefore = metric(limited.url, QStringLiteral("im_writes_rate_limited_total"));
    QTest::mouseClick(child<QPushButton>(w, "burstButton"), Qt::LeftButton);
    QVERIFY(w->statusBar()->currentMessage().contains(QStringLiteral("RATE_LIMITED")));
    QTRY_VERIFY_WITH_TIMEOUT(w->client()->pendingCount() == 0 && outbox->model()->rowCount() == 0, kSettle);
    watch.stop();
    QVERIFY2(limitedRowsSeen > 0, "the Outbox panel never showed a RATE_LIMITED entry");
    QVERIFY2(metric(limited.url, QStringLiteral("im_writes_rate_limited_total")) > limitedBefore,
             "the server answered no send RATE_LIMITED");
    // Exactly once, in the order clicked: the store (the SDK's copy of the
    // server's log, its own sends pushed back included) holds each body once,
    // at increasing seqs; a resend with a new cmid would show twice.
    QStringList clicked;
    for (int i = 1; i <= 80; ++i)
        clicked << QStringLiteral("burst %1/80").arg(i);
    const QString count = QStringLiteral("SELECT count(*) FROM events WHERE conv = 'ana-ben' AND body LIKE 'burst %'");
    const QString bursts = QStringLiteral("SELECT group_concat(body, '|') FROM (SELECT body FROM events "
                                          "WHERE conv = 'ana-ben' AND body LIKE 'burst %' ORDER BY seq)");
    QTRY_COMPARE_WITH_TIMEOUT(sqlScalar(session.dbPath, count).toInt(), 80, kSettle);
    QCOMPARE(sqlScalar(session.dbPath, bursts).toString(), clicked.join(QLatin1Char('|')));
    QTest::qWait(500); // nothing more arrives
    QCOMPARE(sqlScalar(session.dbPath, count).toInt(), 80);
    // And the view: every burst row it shows is Sent, with a seq.
    int shownRows = 0;
    for (int r = 0; r < w->messages()->rowCount(); ++r) {
        const QString body = w->messages()->get(r, MessageListModel::BodyRole).toString();
        if (!body.startsWith(u"burst "))
            continue;
        ++shownRows;
        QVERIFY2(MessageState(w->messages()->get(r, MessageListModel::StateRole).toInt()) == MessageState::Sent &&
                     w->messages()->get(r, MessageListModel::SeqRole).toLongLong() > 0,
                 qPrintable(dump(w->messages(), body)));
    }
    QVERIFY(shownRows > 0);
    qInfo("burst of 80: %d entries shown RATE_LIMITED at once at most", limitedRowsSeen);
}

// Files (obligation 17): ana attaches a file (what the Attach button and a
// drop call) with the typed text; her row shows the file and its upload,
// then Sent; ben's row shows the file, and Save writes the same bytes.
void TestDemoApp::attached_file_shows_its_upload_then_arrives_and_saves_the_same_bytes() {
    ensureBen();
    QVERIFY(ben_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    clickConversation(ben_, QStringLiteral("ana-ben"));
    QByteArray bytes(1024 * 1024 + 3, Qt::Uninitialized);
    for (qsizetype i = 0; i < bytes.size(); ++i)
        bytes[i] = char((i * 131) ^ (i >> 9));
    const QString src = data_.filePath(QStringLiteral("minutes-2026.pdf"));
    {
        QFile f(src);
        QVERIFY(f.open(QIODevice::WriteOnly));
        QCOMPARE(f.write(bytes), bytes.size());
    }
    auto *edit = child<QLineEdit>(ana_, "sendEdit");
    edit->setText(QStringLiteral("the minutes"));
    QVERIFY(child<QPushButton>(ana_, "attachButton")->isEnabled());
    const QString cmid = ana_->messagePanel()->attachFile(src);
    QVERIFY2(!cmid.isEmpty(), qPrintable(ana_->statusBar()->currentMessage()));
    QVERIFY(edit->text().isEmpty());
    const int row = rowOfCmid(ana_->messages(), cmid);
    QVERIFY(row >= 0);
    QVERIFY2(MessagePanel::fileText(ana_->messages()->index(row)).startsWith(QStringLiteral("minutes-2026.pdf (")),
             qPrintable(MessagePanel::fileText(ana_->messages()->index(row))));
    QTRY_COMPARE_WITH_TIMEOUT(MessageState(ana_->messages()->get(rowOfCmid(ana_->messages(), cmid),
                                                                 MessageListModel::StateRole).toInt()),
                              MessageState::Sent, kSettle);
    const qint64 seq = ana_->messages()->get(rowOfCmid(ana_->messages(), cmid), MessageListModel::SeqRole).toLongLong();
    QVERIFY(seq > 0);
    QTRY_VERIFY_WITH_TIMEOUT(rowOfSeq(ben_->messages(), seq) >= 0, kSettle);
    const QModelIndex theirs = ben_->messages()->index(rowOfSeq(ben_->messages(), seq));
    QCOMPARE(theirs.data(MessageListModel::BodyRole).toString(), QStringLiteral("the minutes"));
    const QVariantMap file = theirs.data(MessageListModel::AttachmentsRole).toList().value(0).toMap();
    QCOMPARE(file.value(QStringLiteral("name")).toString(), QStringLiteral("minutes-2026.pdf"));
    const QString out = data_.filePath(QStringLiteral("ben-saved.pdf"));
    QCOMPARE(ben_->messagePanel()->saveAttachment(file.value(QStringLiteral("id")).toString(), out),
             file.value(QStringLiteral("id")).toString());
    QTRY_VERIFY_WITH_TIMEOUT(ben_->statusBar()->currentMessage().startsWith(QStringLiteral("Saved ")), kSettle);
    QFile saved(out);
    QVERIFY(saved.open(QIODevice::ReadOnly));
    QCOMPARE(saved.readAll(), bytes);
    QTRY_VERIFY(MessagePanel::fileText(ben_->messages()->index(rowOfSeq(ben_->messages(), seq))).endsWith(QStringLiteral(" saved")));
}

// --- files: the QA controls (demo50; docs/demo-app.md "Files: QA controls") ---

QByteArray TestDemoApp::attachToBen(const QString &name, qsizetype size, const QString &body, QString *cmid) {
    ensureBen();
    clickConversation(ana_, QStringLiteral("ana-ben"));
    clickConversation(ben_, QStringLiteral("ana-ben"));
    QByteArray bytes(size, Qt::Uninitialized);
    const quint32 seed = QRandomGenerator::global()->generate();
    for (qsizetype i = 0; i < size; ++i)
        bytes[i] = char((i * 131 + seed) ^ (i >> 9) ^ (seed >> (i % 24)));
    const QString src = data_.filePath(name);
    QFile f(src);
    if (!f.open(QIODevice::WriteOnly) || f.write(bytes) != size)
        return {};
    f.close();
    child<QLineEdit>(ana_, "sendEdit")->setText(body);
    *cmid = ana_->messagePanel()->attachFile(src);
    return bytes;
}

void TestDemoApp::expectArrivedIntact(const QString &cmid, const QByteArray &bytes) {
    auto stateOfCmid = [&] {
        const int r = rowOfCmid(ana_->messages(), cmid);
        return r < 0 ? MessageState(-1) : MessageState(ana_->messages()->get(r, MessageListModel::StateRole).toInt());
    };
    QTRY_VERIFY_WITH_TIMEOUT(stateOfCmid() != MessageState::Pending, 60000);
    QCOMPARE(stateOfCmid(), MessageState::Sent);
    const qint64 seq = ana_->messages()->get(rowOfCmid(ana_->messages(), cmid), MessageListModel::SeqRole).toLongLong();
    QVERIFY(seq > 0);
    QTRY_VERIFY_WITH_TIMEOUT(rowOfSeq(ben_->messages(), seq) >= 0, kSettle);
    const QVariantList files = ben_->messages()->index(rowOfSeq(ben_->messages(), seq))
                                   .data(MessageListModel::AttachmentsRole).toList();
    QCOMPARE(files.size(), 1);
    const QString att = files.first().toMap().value(QStringLiteral("id")).toString();
    const QString out = data_.filePath(QStringLiteral("ben-") + cmid);
    QCOMPARE(ben_->messagePanel()->saveAttachment(att, out), att);
    QTRY_VERIFY_WITH_TIMEOUT(ben_->statusBar()->currentMessage() == QStringLiteral("Saved ") + out
                                 || ben_->statusBar()->currentMessage().startsWith(QStringLiteral("Saved ") + out),
                             kSettle);
    QFile saved(out);
    QVERIFY(saved.open(QIODevice::ReadOnly));
    QVERIFY2(saved.readAll() == bytes, "ben's saved file differs from what ana attached");
}

// Client settings > Upload limit (Client::uploadRateLimit): a 1 MiB file at
// 256 KiB/s takes at least the paced time (every piece but the last waited),
// shows intermediate `upload N%` in the File column on the way, and arrives
// intact. No upper bound on time anywhere.
void TestDemoApp::upload_limit_setting_paces_the_upload_and_the_file_arrives_intact() {
    auto *limit = child<QSpinBox>(ana_, "uploadLimitSpin");
    QCOMPARE(limit->value(), 0);
    QCOMPARE(ana_->client()->uploadRateLimit(), qint64(0));
    limit->setValue(256);
    QCOMPARE(ana_->client()->uploadRateLimit(), qint64(256 * 1024));
    QVERIFY(child<QLabel>(ana_, "settingsApplied")->text().contains(QStringLiteral("upload 262144 B/s")));
    QSet<int> percents;
    QString cmid;
    QElapsedTimer clock;
    clock.start();
    const QByteArray bytes = attachToBen(QStringLiteral("paced.bin"), 1024 * 1024, QStringLiteral("paced file"), &cmid);
    QVERIFY2(!cmid.isEmpty(), qPrintable(ana_->statusBar()->currentMessage()));
    // What the File column shows while it uploads (sampled as it goes).
    const QRegularExpression upload(QStringLiteral("upload (\\d+)%"));
    QTRY_VERIFY_WITH_TIMEOUT(([&] {
                                 const int r = rowOfCmid(ana_->messages(), cmid);
                                 const QRegularExpressionMatch m = upload.match(
                                     MessagePanel::fileText(ana_->messages()->index(r)));
                                 if (m.hasMatch())
                                     percents.insert(m.captured(1).toInt());
                                 return r >= 0 && MessageState(ana_->messages()->get(r, MessageListModel::StateRole)
                                                                   .toInt()) != MessageState::Pending;
                             }()),
                             60000);
    const qint64 took = clock.elapsed();
    const qint64 paced = (1024 * 1024 - 64 * 1024) * 1000 / (256 * 1024); // 3750 ms
    QVERIFY2(took >= paced, qPrintable(QStringLiteral("%1 ms; the limit allows no less than %2 ms").arg(took).arg(paced)));
    int between = 0;
    for (int p : std::as_const(percents))
        between += (p > 0 && p < 100) ? 1 : 0;
    QVERIFY2(between >= 2, qPrintable(QStringLiteral("upload percentages seen: %1").arg(percents.size())));
    expectArrivedIntact(cmid, bytes);
}

// Faults > Close socket now mid-upload (the connection-kill control of the
// text scenarios): the upload stops with the session and, after the
// reconnect, goes on from the server's offset (never from 0 again, no byte
// committed twice); one message, one attachment, the same bytes.
void TestDemoApp::close_socket_mid_upload_resumes_from_the_servers_offset() {
    child<QSpinBox>(ana_, "uploadLimitSpin")->setValue(512);
    const qint64 committedBefore = metric(server_->url, QStringLiteral("im_attachment_bytes_in_total"));
    QVERIFY(committedBefore >= 0);
    const qint64 size = 2 * 1024 * 1024;
    bool dropped = false;
    qint64 lowestAfterDrop = -1;
    QSignalSpy connection(ana_->client(), &im::Client::connectionStateChanged);
    connect(ana_->client(), &im::Client::uploadProgress, this, [&](const QString &, qint64 sent, qint64) {
        if (dropped)
            lowestAfterDrop = lowestAfterDrop < 0 ? sent : std::min(lowestAfterDrop, sent);
        if (!dropped && sent >= size / 4) {
            dropped = true;
            QMetaObject::invokeMethod(this, [this] {
                QTest::mouseClick(child<QPushButton>(ana_, "closeSocketButton"), Qt::LeftButton);
            }, Qt::QueuedConnection);
        }
    });
    const auto unhook = qScopeGuard([this] { disconnect(ana_->client(), &im::Client::uploadProgress, this, nullptr); });
    QString cmid;
    const QByteArray bytes = attachToBen(QStringLiteral("dropped.bin"), size, QStringLiteral("dropped midway"), &cmid);
    QVERIFY2(!cmid.isEmpty(), qPrintable(ana_->statusBar()->currentMessage()));
    expectArrivedIntact(cmid, bytes);
    QVERIFY(dropped);
    int connects = 0;
    for (const QList<QVariant> &c : std::as_const(connection))
        connects += c.at(0).value<im::ConnectionState>() == im::ConnectionState::Connected ? 1 : 0;
    QVERIFY2(connects >= 1, "the socket never came back");
    QVERIFY2(lowestAfterDrop >= size / 4 - 512 * 1024 / 4,
             qPrintable(QStringLiteral("after the drop the upload stood at %1 of %2").arg(lowestAfterDrop).arg(size)));
    QCOMPARE(metric(server_->url, QStringLiteral("im_attachment_bytes_in_total")) - committedBefore, size);
}

// Faults > Restart this window mid-upload: the window's client and store
// close as a quit app's, a new window opens the same store, and its outbox
// resumes the upload (the att_id was committed) from the server's offset:
// one message, one attachment, the same bytes, no byte committed twice.
void TestDemoApp::restart_mid_upload_resumes_the_upload_from_the_durable_outbox() {
    child<QSpinBox>(ana_, "uploadLimitSpin")->setValue(512);
    const qint64 committedBefore = metric(server_->url, QStringLiteral("im_attachment_bytes_in_total"));
    QVERIFY(committedBefore >= 0);
    const qint64 size = 2 * 1024 * 1024;
    qint64 seen = 0;
    connect(ana_->client(), &im::Client::uploadProgress, this, [&](const QString &, qint64 sent, qint64) { seen = sent; });
    QString cmid;
    const QByteArray bytes = attachToBen(QStringLiteral("restarted.bin"), size, QStringLiteral("restarted midway"), &cmid);
    QVERIFY2(!cmid.isEmpty(), qPrintable(ana_->statusBar()->currentMessage()));
    QTRY_VERIFY_WITH_TIMEOUT(seen >= size / 4, 60000);
    QVERIFY2(seen < size, "the upload ended before the restart");
    const QString db = ana_->client()->databasePath();
    QSignalSpy opened(manager_.get(), &WindowManager::windowOpened);
    QTest::mouseClick(child<QPushButton>(ana_, "restartWindowButton"), Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(opened.size(), 1, kSettle);
    QTRY_VERIFY(!ana_); // the old window is gone
    ana_ = opened.first().first().value<ChatWindow *>();
    QVERIFY(ana_);
    QVERIFY(QTest::qWaitForWindowExposed(ana_));
    child<QSpinBox>(ana_, "timeoutSpin")->setValue(1500); // as initTestCase set it
    QCOMPARE(ana_->client()->databasePath(), db);
    QVERIFY(ana_->client()->isOpen());
    QVERIFY(!ana_->client()->uploadState(cmid).isEmpty()); // the entry, from the store
    QCOMPARE(child<QSpinBox>(ana_, "uploadLimitSpin")->value(), 0); // a fresh window: unlimited
    waitConnected(ana_);
    clickConversation(ana_, QStringLiteral("ana-ben"));
    expectArrivedIntact(cmid, bytes);
    QCOMPARE(metric(server_->url, QStringLiteral("im_attachment_bytes_in_total")) - committedBefore, size);
}

// Faults > Corrupt next chunk: one byte of a PUT flipped on the wire. The
// server answers 422 DIGEST_MISMATCH (the log pane shows it, the status bar
// said which chunk) and the SDK starts the upload again at 0: the message
// still goes once with the right bytes.
void TestDemoApp::corrupt_next_chunk_shows_digest_mismatch_and_the_file_still_arrives_once() {
    const qint64 mismatchesBefore = metric(server_->url, QStringLiteral("im_attachment_digest_mismatches_total"));
    QVERIFY(mismatchesBefore >= 0);
    auto *log = child<QPlainTextEdit>(ana_, "logView");
    QTest::mouseClick(child<QPushButton>(ana_, "clearLogButton"), Qt::LeftButton);
    QTest::mouseClick(child<QPushButton>(ana_, "corruptChunkButton"), Qt::LeftButton);
    QCOMPARE(ana_->statusBar()->currentMessage(), QStringLiteral("The next upload chunk will have one byte flipped on the way"));
    QString cmid;
    const QByteArray bytes = attachToBen(QStringLiteral("wire.bin"), 600 * 1000, QStringLiteral("damaged on the wire"), &cmid);
    QVERIFY2(!cmid.isEmpty(), qPrintable(ana_->statusBar()->currentMessage()));
    QTRY_VERIFY_WITH_TIMEOUT(log->toPlainText().contains(QStringLiteral("DIGEST_MISMATCH, starting again at 0")), kSettle);
    expectArrivedIntact(cmid, bytes);
    QVERIFY2(log->toPlainText().contains(QStringLiteral("one byte of the PUT at 0 flipped")), qPrintable(log->toPlainText()));
    QCOMPARE(metric(server_->url, QStringLiteral("im_attachment_digest_mismatches_total")), mismatchesBefore + 1);
    QCOMPARE(rowsWithBody(ben_->messages(), QStringLiteral("damaged on the wire")).size(), 1);
}

// Faults > Damage the store's copy mid-upload: what the user attached is
// no longer intact, so the server's 422 DIGEST_MISMATCH is final: the row
// shows Failed: DIGEST_MISMATCH, the outbox lets it go, ben gets nothing.
void TestDemoApp::damaged_store_copy_shows_failed_digest_mismatch_and_nothing_arrives() {
    child<QSpinBox>(ana_, "uploadLimitSpin")->setValue(256);
    qint64 seen = 0;
    connect(ana_->client(), &im::Client::uploadProgress, this, [&](const QString &, qint64 sent, qint64) { seen = sent; });
    const auto unhook = qScopeGuard([this] { disconnect(ana_->client(), &im::Client::uploadProgress, this, nullptr); });
    QSignalSpy typed(ana_->client(), &im::Client::errorReported);
    QString cmid;
    const QString body = QStringLiteral("damaged on disk");
    (void)attachToBen(QStringLiteral("disk.bin"), 1024 * 1024, body, &cmid);
    QVERIFY2(!cmid.isEmpty(), qPrintable(ana_->statusBar()->currentMessage()));
    QTRY_VERIFY_WITH_TIMEOUT(seen > 0, kSettle);
    QVERIFY2(seen < 1024 * 1024, "the upload ended before the copy could be damaged");
    QTest::mouseClick(child<QPushButton>(ana_, "damageCopyButton"), Qt::LeftButton);
    QVERIFY2(ana_->statusBar()->currentMessage().startsWith(QStringLiteral("Flipped the last byte of ")),
             qPrintable(ana_->statusBar()->currentMessage()));
    QVERIFY(ana_->statusBar()->currentMessage().contains(cmid));
    QTRY_COMPARE_WITH_TIMEOUT(shown(ana_, body, ChatWindow::StateColumn), QStringLiteral("Failed: DIGEST_MISMATCH"), 60000);
    bool sawTyped = false;
    for (const QList<QVariant> &e : std::as_const(typed))
        sawTyped = sawTyped || e.at(0).value<im::Error>() == im::Error::DigestMismatch;
    QVERIFY(sawTyped);
    QTRY_COMPARE(ana_->client()->pendingCount(), 0);
    QVERIFY(ana_->client()->uploadState(cmid).isEmpty());
    // A text after it reaches ben; the file's message never does.
    typeAndSend(ana_, QStringLiteral("after the damaged file"));
    QTRY_VERIFY_WITH_TIMEOUT(rowOf(ben_->messages(), QStringLiteral("after the damaged file")) >= 0, kSettle);
    QCOMPARE(rowsWithBody(ben_->messages(), body).size(), 0);
}

int main(int argc, char **argv) {
    if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM"))
        qputenv("QT_QPA_PLATFORM", "offscreen");
    QApplication app(argc, argv);
    TestDemoApp t;
    QTEST_SET_MAIN_SOURCE_PATH
    return QTest::qExec(&t, argc, argv);
}

#include "tst_demoapp.moc"
