// The message view of a chat window: the selected conversation, newest at
// the bottom through an im::ReversedProxyModel (state, sender, time, seq,
// dup, cmid per row; the Message column drawn by MessageDelegate: quote,
// edited, reactions), its markers, the history window controls, the send
// box, and the per-message actions (recall, cancel, discard; reply, edit and
// react through MessageActions). It advances the read marker as rows come
// into view.
#pragma once

#include <im/types.h>

#include <QtCore/QHash>
#include <QtCore/QSet>
#include <QtCore/QVariant>
#include <QtWidgets/QGroupBox>

namespace im {
class Client;
class ConversationListModel;
class MessageListModel;
class ReversedProxyModel;
} // namespace im

class MessageActions;
class MessageDelegate;
class QDragEnterEvent;
class QDropEvent;
class QLabel;
class QMenu;
class QModelIndex;
class QLineEdit;
class QPushButton;
class QSpinBox;
class QTableView;
class QTimer;
class RoleTableModel;

class MessagePanel : public QGroupBox {
    Q_OBJECT
public:
    /// Columns of the message view.
    enum Column { SeqColumn, TimeColumn, SenderColumn, BodyColumn, StateColumn, DupColumn, CmidColumn, FileColumn };

    MessagePanel(im::Client *client, im::MessageListModel *msgs, im::ConversationListModel *convs,
                 QWidget *parent = nullptr);

    /// Shows `conv` (the model loads it) and schedules a read marker.
    void setConversation(const QString &conv);
    QString conversation() const { return conv_; }
    /// The header line: markers of the shown conversation.
    void updateHeader();
    /// Disables the send box (the database did not open).
    void setSendEnabled(bool enabled);
    /// Selects and scrolls to the message at `seq` of the shown
    /// conversation (a search result), loading older rows until it shows
    /// (at most 50 loads). False if it is not there after that.
    void showMessage(qint64 seq);
    /// The seq of the selected row (0: none).
    qint64 selectedSeq() const;

    /// "Pending", "Sent", "Failed: NOT_MEMBER", "Expired: ORIGINAL_EXPIRED", "Recalled".
    static QString stateText(im::MessageState state, const QString &errorCode);
    /// The Message column's MessageDelegate roles for timeline row `source`.
    static QVariant changeData(const QModelIndex &source, int role);
    /// Reply / edit / react (the composer above the send box, its outcome label).
    MessageActions *actions() const { return actions_; }

Q_SIGNALS:
    /// For the window's status bar.
    void statusMessage(const QString &text, int timeoutMs);
    /// What a cancel / discard did (panelutil.h's texts).
    void actionDone(const QString &text);

public:
    /// Files (obligation 17): sends the file at `path` to the open
    /// conversation with the typed text (the Attach button, a drop); the
    /// cmid, or empty (status bar says why).
    QString attachFile(const QString &path);
    /// Downloads attachment `attId` to `path` (Save / Open); the request id.
    QString saveAttachment(const QString &attId, const QString &path);
    /// The File column's text of a message row (name, size, transfers).
    static QString fileText(const QModelIndex &source);

protected:
    void dragEnterEvent(QDragEnterEvent *e) override;
    void dropEvent(QDropEvent *e) override;

private:
    void addFileActions(QMenu *menu, const QModelIndex &src);
    QPushButton *attachButton_ = nullptr;
    bool downloadsWired_ = false;
    QSet<QString> openWhenDone_; ///< paths of "Open file" downloads
    void sendTyped();
    void loadOlder();
    void fillSelectedGap();
    void updateHistoryControls();
    void showMessageMenu(const QPoint &pos);
    void scheduleReadMarker();
    /// Refits the ResizeToContents columns to the rows now shown (once per
    /// event loop turn).
    void scheduleFitColumns();
    void advanceReadMarker();
    /// Sizes the rows that hold a quote or reaction chips (once per event
    /// loop turn, with the columns).
    void fitRowHeights();
    /// After a scroll by the user: at the top, one fetchMore(); back at the
    /// bottom after loading older rows, followNewest().
    void onUserScrolled(bool top, bool bottom); // where the user's action left the slider
    /// The timeline model's row shown at view row `viewRow` (-1: none).
    int modelRow(int viewRow) const;

    im::Client *client_;
    im::MessageListModel *msgs_;
    im::ConversationListModel *convs_;
    im::ReversedProxyModel *order_; ///< msgs_ upside down: newest at the bottom
    RoleTableModel *table_;
    QString conv_;
    QHash<QString, qint64> readRequested_; ///< highest markRead sent per conv
    QSet<QString> recallCmids_;
    bool followTail_ = true;
    qint64 jumpTo_ = 0;   ///< showMessage() waiting for its row
    int jumpLoads_ = 0;   ///< fetchMore()s it has asked for
    bool tryJump();
    bool fitPending_ = false;

    QTableView *view_;
    MessageDelegate *delegate_;
    MessageActions *actions_;
    QLabel *header_;
    QLineEdit *sendEdit_;
    QPushButton *sendButton_;
    QPushButton *discardButton_;
    QPushButton *loadOlderButton_;
    QPushButton *fillGapButton_;
    QSpinBox *windowRowsSpin_;
    QSpinBox *historyWindowSpin_;
    QSpinBox *backlogLimitSpin_;
    QLabel *historyLabel_;
    QTimer *readTimer_;
};
