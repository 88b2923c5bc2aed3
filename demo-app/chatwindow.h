// One chat window: one im::Client, one SQLite file, one signed-in device.
// Panels: conversations (unread counts), the message view (state, sender,
// time, seq, dup per message) with the send box, the connection indicator,
// the fault panel, and the outbox panel.
#pragma once

#include "signindialog.h"

#include <im/types.h>

#include <QtCore/QHash>
#include <QtCore/QSet>
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

class FaultClient;
class QComboBox;
class QLabel;
class QLineEdit;
class QMenu;
class QPushButton;
class QSpinBox;
class QTableView;
class QTimer;
class RoleTableModel;

class ChatWindow : public QMainWindow {
    Q_OBJECT
public:
    /// Columns of the message view.
    enum MessageColumn { SeqColumn, TimeColumn, SenderColumn, BodyColumn, StateColumn, DupColumn, CmidColumn };
    /// Columns of the outbox panel.
    enum OutboxColumn { OCmid, OKind, OConv, OWhat, OAttempts, OLastError, ONextRetry, OInFlight, OPrev };

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

Q_SIGNALS:
    /// File > Open another window.
    void openAnotherRequested();

private:
    QWidget *buildConversationPanel();
    QWidget *buildMessagePanel();
    QWidget *buildConnectionPanel();
    QWidget *buildFaultPanel();
    QWidget *buildOutboxPanel();
    void buildMenus();

    void sendTyped();
    void cancelOutboxEntry(const QString &cmid);
    void discardMessage(const QString &cmid);
    void loadOlder();
    void fillSelectedGap();
    void updateHistoryControls();
    void showMessageMenu(const QPoint &pos);
    void updateConnection();
    void updateIdentity();
    /// "Token expires in N s" (obligation 14): from Client::tokenExpiresAt.
    void updateTokenExpiry();
    void updateConversationHeader();
    void updateOutboxDepth();
    void reselectConversation();
    void scheduleReadMarker();
    void advanceReadMarker();
    void armServerFault(bool off);
    QUrl labServer() const;

    Session session_;
    im::Client *client_;
    im::ConversationListModel *convs_;
    im::MessageListModel *msgs_;
    im::OutboxModel *outbox_;
    RoleTableModel *convTable_;
    RoleTableModel *msgTable_;
    RoleTableModel *outboxTable_;
    im::testing::Faults *clientFaults_;
    FaultClient *faults_;
    QString currentConv_;
    QHash<QString, qint64> readRequested_; ///< highest markRead sent per conv
    QSet<QString> recallCmids_;
    bool followTail_ = true;
    QString lastActionText_;

    QTableView *convView_;
    QTableView *messageView_;
    QTableView *outboxView_;
    QLabel *convHeader_;
    QLineEdit *sendEdit_;
    QPushButton *sendButton_;
    QPushButton *discardButton_;
    QPushButton *loadOlderButton_;
    QPushButton *fillGapButton_;
    QSpinBox *windowRowsSpin_;
    QSpinBox *historyWindowSpin_;
    QSpinBox *backlogLimitSpin_;
    QLabel *historyLabel_;
    QLabel *connLabel_;
    QLabel *identityLabel_;
    QLabel *errorLabel_;
    QLabel *tokenExpiryLabel_;
    QLabel *credentialsLabel_;
    QLineEdit *newTokenEdit_;
    QWidget *staleBox_;
    QLabel *outboxDepth_;
    QPushButton *offlineButton_;
    QSpinBox *timeoutSpin_;
    QComboBox *faultPoint_;
    QComboBox *faultAction_;
    QSpinBox *faultCount_;
    QLabel *faultAnswer_;
    QLabel *labUrlLabel_;
    QLabel *statusConn_;
    QTimer *tick_;
    QTimer *readTimer_;
};
