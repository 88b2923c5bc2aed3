// One chat window: one im::Client, one SQLite file, one signed-in device.
// It assembles the panels (one class each): conversations (left), messages
// (middle), connection, faults and client settings (right), outbox and the
// SDK log (bottom); it owns the client, its models and the selected
// conversation, and shows the panels' messages in its status bar.
#pragma once

#include "messagepanel.h"
#include "outboxpanel.h"
#include "signindialog.h"

#include <im/types.h>

#include <QtWidgets/QMainWindow>

namespace im {
class Client;
class ConversationListModel;
class MessageListModel;
class OutboxModel;
namespace testing {
class Faults;
}
} // namespace im

class ConnectionPanel;
class ConversationPanel;
class FaultPanel;
class LogPanel;
class QLabel;
class QTimer;
class SearchPanel;
class SettingsPanel;

class ChatWindow : public QMainWindow {
    Q_OBJECT
public:
    /// Columns of the message view (MessagePanel::Column).
    enum MessageColumn {
        SeqColumn = MessagePanel::SeqColumn,
        TimeColumn = MessagePanel::TimeColumn,
        SenderColumn = MessagePanel::SenderColumn,
        BodyColumn = MessagePanel::BodyColumn,
        StateColumn = MessagePanel::StateColumn,
        DupColumn = MessagePanel::DupColumn,
        CmidColumn = MessagePanel::CmidColumn
    };
    /// Columns of the outbox panel (OutboxPanel::Column).
    enum OutboxColumn {
        OCmid = OutboxPanel::OCmid,
        OKind = OutboxPanel::OKind,
        OConv = OutboxPanel::OConv,
        OWhat = OutboxPanel::OWhat,
        OAttempts = OutboxPanel::OAttempts,
        OLastError = OutboxPanel::OLastError,
        ONextRetry = OutboxPanel::ONextRetry,
        OInFlight = OutboxPanel::OInFlight,
        OPrev = OutboxPanel::OPrev,
        OHeld = OutboxPanel::OHeld
    };

    /// Opens the session's database and connects. A failed open shows the
    /// reason in the window (and disables sending).
    explicit ChatWindow(const Session &session, QWidget *parent = nullptr);
    ~ChatWindow() override;

    const Session &session() const { return session_; }
    /// What the connection panel says about TLS ("TLS: off (ws://)", ...).
    QString tlsText() const;
    im::Client *client() const { return client_; }
    im::ConversationListModel *conversations() const { return convs_; }
    im::MessageListModel *messages() const { return msgs_; }
    im::OutboxModel *outbox() const { return outbox_; }
    /// The client's QA hooks (offline, dropped reply, dropped socket).
    im::testing::Faults *clientFaults() const { return clientFaults_; }
    QString currentConversation() const { return currentConv_; }
    /// Shows `conv` in the message view (also selects it in the list).
    void selectConversation(const QString &conv);

    /// "Pending", "Sent", "Failed: NOT_MEMBER", "Expired: ORIGINAL_EXPIRED", "Recalled".
    static QString stateText(im::MessageState state, const QString &errorCode);
    /// The connection indicator text (plain), e.g. "Connected - gateway gw-1".
    QString connectionText() const;
    /// What the last cancel / discard did ("Cancelled ...", "Not cancelled: ...").
    QString lastActionText() const { return lastActionText_; }

    FaultPanel *faultPanel() const { return faultPanel_; }
    SettingsPanel *settingsPanel() const { return settingsPanel_; }
    LogPanel *logPanel() const { return logPanel_; }
    SearchPanel *searchPanel() const { return searchPanel_; }
    MessagePanel *messagePanel() const { return messagePanel_; }

Q_SIGNALS:
    /// File > Open another window.
    void openAnotherRequested();
    /// Faults > Restart this window (the window manager reopens it on the same store).
    void restartRequested();

private:
    void buildMenus();
    void reselectConversation();
    void updateConnection();
    void updateTitle();
    void showStatus(const QString &text, int timeoutMs);
    void recordAction(const QString &text);

    Session session_;
    im::Client *client_;
    im::ConversationListModel *convs_;
    im::MessageListModel *msgs_;
    im::OutboxModel *outbox_;
    im::testing::Faults *clientFaults_;
    QString currentConv_;
    QString lastActionText_;

    ConversationPanel *convPanel_;
    MessagePanel *messagePanel_;
    ConnectionPanel *connPanel_;
    FaultPanel *faultPanel_;
    SettingsPanel *settingsPanel_;
    OutboxPanel *outboxPanel_;
    LogPanel *logPanel_;
    SearchPanel *searchPanel_;
    QLabel *statusConn_;
    QTimer *tick_;
};
