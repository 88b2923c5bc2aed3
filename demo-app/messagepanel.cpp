#include "messagepanel.h"

#include "messageactions.h"
#include "messagedelegate.h"
#include "panelutil.h"
#include "roletablemodel.h"

#include <im/client.h>
#include <im/conversationlistmodel.h>
#include <im/messagelistmodel.h>
#include <im/reversedproxymodel.h>

#include <QtCore/QDateTime>
#include <QtCore/QTimer>
#include <QtGui/QAction>
#include <QtGui/QClipboard>
#include <QtGui/QColor>
#include <QtGui/QFont>
#include <QtGui/QGuiApplication>
#include <QtWidgets/QHBoxLayout>
#include <QtWidgets/QHeaderView>
#include <QtWidgets/QLabel>
#include <QtGui/QDesktopServices>
#include <QtGui/QDragEnterEvent>
#include <QtGui/QDropEvent>
#include <QtCore/QMimeData>
#include <QtCore/QStandardPaths>
#include <QtCore/QFileInfo>
#include <QtCore/QDir>
#include <QtCore/QLocale>
#include <QtWidgets/QFileDialog>
#include <QtWidgets/QLineEdit>
#include <QtWidgets/QMenu>
#include <QtWidgets/QPushButton>
#include <QtWidgets/QScrollBar>
#include <QtWidgets/QSpinBox>
#include <QtWidgets/QTableView>
#include <QtWidgets/QVBoxLayout>

#include <algorithm>

using im::ConversationListModel;
using im::MessageListModel;
using im::MessageState;

namespace {

QColor stateColor(MessageState s) {
    switch (s) {
    case MessageState::Pending: return QColor(0xff, 0xf1, 0xb8);
    case MessageState::Sent: return QColor(0xdc, 0xf3, 0xdf);
    case MessageState::Failed: return QColor(0xff, 0xd0, 0xd0);
    case MessageState::Expired: return QColor(0xe4, 0xdc, 0xf5);
    case MessageState::Recalled: return QColor(0xe2, 0xe2, 0xe2);
    }
    return {};
}

} // namespace

QVariant MessagePanel::changeData(const QModelIndex &s, int role) {
    switch (role) {
    case MessageDelegate::QuoteRole: {
        const qint64 to = s.data(MessageListModel::ReplyToRole).toLongLong();
        if (to <= 0)
            return QString();
        const QString who = s.data(MessageListModel::QuoteSenderRole).toString();
        if (who.isEmpty())
            return QStringLiteral("reply to seq %1").arg(to);
        return QStringLiteral("%1: %2").arg(who, s.data(MessageListModel::QuoteTextRole).toString());
    }
    case MessageDelegate::EditedMarkRole:
        return s.data(MessageListModel::EditedRole).toBool() ? QStringLiteral("(edited)") : QString();
    case MessageDelegate::PendingMarkRole:
        return s.data(MessageListModel::ChangePendingRole).toBool() ? QStringLiteral("change pending") : QString();
    case MessageDelegate::ReactionsRole: return s.data(MessageListModel::ReactionsRole).toList();
    }
    return {};
}

QString MessagePanel::stateText(MessageState state, const QString &errorCode) {
    switch (state) {
    case MessageState::Pending: return QStringLiteral("Pending");
    case MessageState::Sent: return QStringLiteral("Sent");
    case MessageState::Failed:
        return errorCode.isEmpty() ? QStringLiteral("Failed") : QStringLiteral("Failed: %1").arg(errorCode);
    case MessageState::Expired:
        return QStringLiteral("Expired: %1").arg(errorCode.isEmpty() ? QStringLiteral("ORIGINAL_EXPIRED") : errorCode);
    case MessageState::Recalled: return QStringLiteral("Recalled");
    }
    return {};
}

MessagePanel::MessagePanel(im::Client *client, MessageListModel *msgs, ConversationListModel *convs, QWidget *parent)
    : QGroupBox(tr("Messages"), parent), client_(client), msgs_(msgs), convs_(convs), readTimer_(new QTimer(this)) {
    setObjectName(QStringLiteral("messagePanel"));
    readTimer_->setSingleShot(true);
    readTimer_->setInterval(150);
    connect(readTimer_, &QTimer::timeout, this, &MessagePanel::advanceReadMarker);
    connect(client_, &im::Client::messageStateChanged, this,
            [this](const QString &conv, const QString &cmid, qint64 seq, MessageState st, const QString &code) {
                if (!recallCmids_.contains(cmid) || st == MessageState::Pending)
                    return;
                recallCmids_.remove(cmid);
                emit statusMessage(QStringLiteral("Recall in %1 (request %2): %3%4")
                                       .arg(conv, cmid.left(8), stateText(st, code),
                                            seq > 0 ? QStringLiteral(", recall event seq %1").arg(seq) : QString()),
                                   15000);
            });
    // Newest at the bottom, as in every chat: the SDK's row-reversing proxy
    // (it never lets the view pull history: see onUserScrolled()).
    order_ = new im::ReversedProxyModel(this);
    order_->setObjectName(QStringLiteral("messageOrder"));
    order_->setSourceModel(msgs_);
    table_ = new RoleTableModel(
        order_,
        {{tr("Seq"),
          [](const QModelIndex &s, int role) -> QVariant {
              const qint64 seq = s.data(MessageListModel::SeqRole).toLongLong();
              if (role == Qt::DisplayRole)
                  return seq > 0 ? QVariant(seq) : QVariant(QStringLiteral("-"));
              if (role == Qt::TextAlignmentRole)
                  return int(Qt::AlignRight | Qt::AlignVCenter);
              return {};
          }},
         {tr("Time"),
          [](const QModelIndex &s, int role) -> QVariant {
              const QDateTime t = s.data(MessageListModel::TimestampRole).toDateTime();
              if (role == Qt::DisplayRole)
                  return t.toLocalTime().toString(QStringLiteral("HH:mm:ss"));
              if (role == Qt::ToolTipRole)
                  return t.toLocalTime().toString(Qt::ISODateWithMs);
              return {};
          }},
         {tr("Sender"),
          [](const QModelIndex &s, int role) -> QVariant {
              if (role == Qt::DisplayRole) {
                  const QString who = s.data(MessageListModel::SenderRole).toString();
                  return s.data(MessageListModel::IsOwnRole).toBool() ? who + QStringLiteral(" (you)") : who;
              }
              return {};
          }},
         {tr("Message"),
          [](const QModelIndex &s, int role) -> QVariant {
              const QString kind = s.data(MessageListModel::KindRole).toString();
              const auto st = MessageState(s.data(MessageListModel::StateRole).toInt());
              if (kind == QLatin1String("gap")) {
                  if (role == Qt::DisplayRole || role == Qt::ToolTipRole)
                      return QStringLiteral("... gap: seqs %1-%2 not loaded (select it and press Fill gap)")
                          .arg(s.data(MessageListModel::GapFromRole).toLongLong())
                          .arg(s.data(MessageListModel::GapToRole).toLongLong());
                  if (role == Qt::ForegroundRole)
                      return QColor(0x80, 0x40, 0x00);
                  if (role == Qt::FontRole) {
                      QFont f;
                      f.setItalic(true);
                      return f;
                  }
                  return {};
              }
              if (role == Qt::DisplayRole || role == Qt::ToolTipRole) {
                  if (kind == QLatin1String("join"))
                      return QStringLiteral("%1 joined").arg(s.data(MessageListModel::UserRole).toString());
                  if (kind == QLatin1String("leave"))
                      return QStringLiteral("%1 left").arg(s.data(MessageListModel::UserRole).toString());
                  return s.data(MessageListModel::BodyRole);
              }
              // Replies, edits, reactions: drawn by MessageDelegate.
              if (kind == QLatin1String("msg") && role >= MessageDelegate::QuoteRole
                  && role <= MessageDelegate::ReactionsRole)
                  return MessagePanel::changeData(s, role);
              if (role == Qt::FontRole && (kind != QLatin1String("msg") || st == MessageState::Recalled)) {
                  QFont f;
                  f.setItalic(true);
                  f.setStrikeOut(st == MessageState::Recalled);
                  return f;
              }
              if (role == Qt::ForegroundRole && (kind != QLatin1String("msg") || st == MessageState::Recalled))
                  return QColor(Qt::darkGray);
              return {};
          }},
         {tr("State"),
          [](const QModelIndex &s, int role) -> QVariant {
              const auto st = MessageState(s.data(MessageListModel::StateRole).toInt());
              if (s.data(MessageListModel::KindRole).toString() == QLatin1String("gap")) {
                  if (role == Qt::DisplayRole)
                      return QStringLiteral("Gap");
                  if (role == Qt::BackgroundRole)
                      return QColor(0xff, 0xe0, 0xb0);
                  return {};
              }
              // A held draft (obligation 10): written under another user's
              // token, never sent in this store's sessions: apart from Pending.
              const bool held = s.data(MessageListModel::HeldRole).toBool();
              if (role == Qt::DisplayRole)
                  return held ? QStringLiteral("Held") : stateText(st, s.data(MessageListModel::ErrorCodeRole).toString());
              if (role == Qt::BackgroundRole)
                  return held ? QColor(0xd8, 0xd8, 0xd8) : stateColor(st);
              if (role == Qt::ToolTipRole && held)
                  return QStringLiteral("held: written under another user's token; never sent as this window's user "
                                        "(Outbox > Discard held drafts)");
              if (role == Qt::FontRole && st != MessageState::Sent) {
                  QFont f;
                  f.setBold(true);
                  return f;
              }
              return {};
          }},
         {tr("Dup"),
          [](const QModelIndex &s, int role) -> QVariant {
              const bool dup = s.data(MessageListModel::DupRole).toBool();
              if (role == Qt::DisplayRole)
                  return dup ? QStringLiteral("dup") : QString();
              if (role == Qt::ToolTipRole && dup)
                  return QStringLiteral("the server answered dup:true: a resend of this cmid hit the original");
              if (role == Qt::ForegroundRole && dup)
                  return QColor(0xb0, 0x40, 0x00);
              return {};
          }},
         {tr("cmid"),
          [](const QModelIndex &s, int role) -> QVariant {
              const QString cmid = s.data(MessageListModel::CmidRole).toString();
              if (role == Qt::DisplayRole)
                  return cmid.left(8);
              if (role == Qt::ToolTipRole)
                  return cmid;
              if (role == Qt::FontRole) {
                  QFont f(QStringLiteral("monospace"));
                  f.setStyleHint(QFont::Monospace);
                  return f;
              }
              return {};
          }},
         // Files (obligation 17): name and size, the upload of ours while
         // Pending, a download's state (docs/demo-app.md "Files").
         {tr("File"),
          [](const QModelIndex &s, int role) -> QVariant {
              if (role != Qt::DisplayRole && role != Qt::ToolTipRole)
                  return {};
              return MessagePanel::fileText(s);
          }}},
        this);
    view_ = makeTable(QStringLiteral("messageView"));
    view_->setModel(table_);
    delegate_ = new MessageDelegate(view_);
    delegate_->setObjectName(QStringLiteral("messageDelegate"));
    view_->setItemDelegateForColumn(BodyColumn, delegate_);
    auto *h = view_->horizontalHeader();
    for (int c = 0; c < table_->columnCount(); ++c)
        h->setSectionResizeMode(c, c == BodyColumn ? QHeaderView::Stretch : QHeaderView::ResizeToContents);
    view_->setContextMenuPolicy(Qt::CustomContextMenu);
    connect(view_, &QWidget::customContextMenuRequested, this, &MessagePanel::showMessageMenu);
    // The timeline is newest first (obligation 15), shown upside down: the
    // newest message is the bottom row. Follow it while the view is at the
    // bottom. The table never loads older rows by itself (the proxy answers
    // canFetchMore() false): a scroll to the top by the user is one
    // fetchMore() (onUserScrolled), as is the "Load older" button.
    connect(table_, &QAbstractItemModel::rowsAboutToBeInserted, this, [this] {
        const QScrollBar *sb = view_->verticalScrollBar();
        followTail_ = sb->value() >= sb->maximum();
    });
    connect(table_, &QAbstractItemModel::rowsInserted, this, [this] {
        if (followTail_)
            QTimer::singleShot(0, view_, &QTableView::scrollToBottom);
        scheduleReadMarker();
    });
    connect(table_, &QAbstractItemModel::modelReset, this, [this] {
        QTimer::singleShot(0, view_, &QTableView::scrollToBottom);
        scheduleReadMarker();
    });
    // Only what the user does (wheel, drag, arrows, page clicks), never a
    // scroll made by the program or a layout.
    // Where the user's action puts the slider is read now (actionTriggered
    // comes with sliderPosition already moved): a scroll to the bottom the
    // program queued before (rowsInserted) may run before the queued call
    // and must not turn the user's scroll to the top into "at the bottom".
    // The range may grow before the queued call runs (rows arriving), so
    // "at the top" / "at the bottom" is judged here, against the range the
    // user saw.
    connect(view_->verticalScrollBar(), &QAbstractSlider::actionTriggered, this, [this] {
        const QScrollBar *sb = view_->verticalScrollBar();
        if (sb->minimum() == sb->maximum())
            return;
        const int position = sb->sliderPosition();
        const bool top = position <= sb->minimum(), bottom = position >= sb->maximum();
        QTimer::singleShot(0, this, [this, top, bottom] { onUserScrolled(top, bottom); });
    });
    connect(table_, &QAbstractItemModel::dataChanged, this, &MessagePanel::scheduleReadMarker);
    // QHeaderView sizes ResizeToContents columns when columns or the view
    // change, not when rows arrive: a conversation opened with no rows yet
    // kept header-wide columns ("06...") until the window was resized.
    connect(table_, &QAbstractItemModel::rowsInserted, this, &MessagePanel::scheduleFitColumns);
    connect(table_, &QAbstractItemModel::modelReset, this, &MessagePanel::scheduleFitColumns);
    connect(table_, &QAbstractItemModel::dataChanged, this, &MessagePanel::scheduleFitColumns);
    connect(view_->verticalScrollBar(), &QScrollBar::valueChanged, this, &MessagePanel::scheduleReadMarker);

    header_ = new QLabel(tr("No conversation selected"));
    header_->setObjectName(QStringLiteral("conversationHeader"));
    header_->setTextFormat(Qt::RichText);

    sendEdit_ = new QLineEdit;
    sendEdit_->setObjectName(QStringLiteral("sendEdit"));
    sendEdit_->setPlaceholderText(tr("Type a message and press Enter"));
    sendEdit_->setMaxLength(4000);
    sendButton_ = new QPushButton(tr("Send"));
    sendButton_->setObjectName(QStringLiteral("sendButton"));
    connect(sendEdit_, &QLineEdit::returnPressed, this, &MessagePanel::sendTyped);
    connect(sendButton_, &QPushButton::clicked, this, &MessagePanel::sendTyped);
    attachButton_ = new QPushButton(tr("Attach..."));
    attachButton_->setObjectName(QStringLiteral("attachButton"));
    attachButton_->setToolTip(tr("Send a file (the text typed goes with it); or drop files on this panel"));
    connect(attachButton_, &QPushButton::clicked, this, [this] {
        const QString path = QFileDialog::getOpenFileName(this, tr("Send a file"));
        if (!path.isEmpty())
            attachFile(path);
    });
    setAcceptDrops(true);
    auto *sendRow = new QHBoxLayout;
    sendRow->addWidget(sendEdit_, 1);
    sendRow->addWidget(attachButton_);
    sendRow->addWidget(sendButton_);
    // Reply / edit / react: the menu actions, the composer bar, chip clicks.
    actions_ = new MessageActions(client_, sendEdit_, sendButton_);
    connect(actions_, &MessageActions::statusMessage, this, &MessagePanel::statusMessage);
    connect(delegate_, &MessageDelegate::chipClicked, this,
            [this](const QModelIndex &index, const QString &emoji, bool mine) {
                actions_->react(table_->sourceIndex(index.row()), conv_, emoji, !mine);
            });

    // History window: what the model shows and what the client loads.
    loadOlderButton_ = new QPushButton(tr("Load older"));
    loadOlderButton_->setObjectName(QStringLiteral("loadOlderButton"));
    loadOlderButton_->setToolTip(tr("MessageListModel::fetchMore(): older rows from the local store, else a "
                                    "history window from the server"));
    connect(loadOlderButton_, &QPushButton::clicked, this, &MessagePanel::loadOlder);
    fillGapButton_ = new QPushButton(tr("Fill gap"));
    fillGapButton_->setObjectName(QStringLiteral("fillGapButton"));
    fillGapButton_->setToolTip(tr("MessageListModel::fillGap(): loads the newest part of the selected gap row "
                                  "(or of the newest gap when none is selected)"));
    connect(fillGapButton_, &QPushButton::clicked, this, &MessagePanel::fillSelectedGap);
    windowRowsSpin_ = new QSpinBox;
    windowRowsSpin_->setObjectName(QStringLiteral("windowRowsSpin"));
    windowRowsSpin_->setRange(1, 1000);
    windowRowsSpin_->setValue(msgs_->windowRows());
    windowRowsSpin_->setToolTip(tr("MessageListModel::windowRows: rows shown while at the newest message (each "
                                   "arrival drops the oldest), and added by each Load older"));
    connect(windowRowsSpin_, &QSpinBox::valueChanged, msgs_, &MessageListModel::setWindowRows);
    historyWindowSpin_ = new QSpinBox;
    historyWindowSpin_->setObjectName(QStringLiteral("historyWindowSpin"));
    historyWindowSpin_->setRange(1, 200);
    historyWindowSpin_->setValue(100);
    historyWindowSpin_->setToolTip(tr("Client::setHistoryWindow(): events per history window from the server"));
    connect(historyWindowSpin_, &QSpinBox::valueChanged, client_, &im::Client::setHistoryWindow);
    backlogLimitSpin_ = new QSpinBox;
    backlogLimitSpin_->setObjectName(QStringLiteral("backlogLimitSpin"));
    backlogLimitSpin_->setRange(0, 1000000);
    backlogLimitSpin_->setValue(1000);
    backlogLimitSpin_->setSpecialValueText(tr("off"));
    backlogLimitSpin_->setToolTip(tr("Client::setBacklogLimit(): a conversation further behind than this opens "
                                     "with its newest window and a gap (0: always sync everything)"));
    connect(backlogLimitSpin_, &QSpinBox::valueChanged, client_, &im::Client::setBacklogLimit);
    historyLabel_ = new QLabel;
    historyLabel_->setObjectName(QStringLiteral("historyLabel"));
    connect(msgs_, &MessageListModel::loadingOlderChanged, this, &MessagePanel::updateHistoryControls);
    connect(msgs_, &QAbstractItemModel::rowsInserted, this, &MessagePanel::updateHistoryControls);
    connect(msgs_, &QAbstractItemModel::rowsRemoved, this, &MessagePanel::updateHistoryControls);
    connect(msgs_, &QAbstractItemModel::modelReset, this, &MessagePanel::updateHistoryControls);
    connect(msgs_, &QAbstractItemModel::dataChanged, this, &MessagePanel::updateHistoryControls);
    auto *historyRow = new QHBoxLayout;
    historyRow->addWidget(loadOlderButton_);
    historyRow->addWidget(fillGapButton_);
    historyRow->addWidget(new QLabel(tr("Rows:")));
    historyRow->addWidget(windowRowsSpin_);
    historyRow->addWidget(new QLabel(tr("Window:")));
    historyRow->addWidget(historyWindowSpin_);
    historyRow->addWidget(new QLabel(tr("Backlog limit:")));
    historyRow->addWidget(backlogLimitSpin_);
    historyRow->addWidget(historyLabel_, 1);

    discardButton_ = new QPushButton(tr("Discard"));
    discardButton_->setObjectName(QStringLiteral("discardButton"));
    discardButton_->setToolTip(tr("Client::discard(): removes the selected Failed / Expired message of yours"));
    connect(discardButton_, &QPushButton::clicked, this, [this] {
        const QModelIndex cur = view_->currentIndex();
        if (!cur.isValid()) {
            emit statusMessage(tr("Select a Failed or Expired message first"), 5000);
            return;
        }
        const QString cmid = table_->sourceIndex(cur.row()).data(MessageListModel::CmidRole).toString();
        emit actionDone(discardMessage(client_, cmid));
    });
    sendRow->addWidget(discardButton_);

    auto *hint = new QLabel(tr("Right-click a message to reply, edit or react (click a reaction chip to add or "
                               "remove yours); right-click one of your messages to recall it (Sent), cancel it "
                               "(Pending, not on the wire yet) or discard it (Failed / Expired). Read markers "
                               "advance as messages scroll into view."));
    hint->setStyleSheet(QStringLiteral("color: gray"));
    hint->setWordWrap(true);

    auto *l = new QVBoxLayout;
    l->addWidget(header_);
    l->addLayout(historyRow);
    l->addWidget(view_, 1);
    l->addWidget(actions_);
    l->addLayout(sendRow);
    l->addWidget(hint);
    setLayout(l);
    updateHistoryControls();
}

void MessagePanel::setConversation(const QString &conv) {
    if (conv != conv_) {
        if (actions_->mode() != MessageActions::Mode::Send)
            actions_->cancelCompose();
        conv_ = conv;
        msgs_->setConversation(conv);
    }
    updateHeader();
    scheduleReadMarker();
}

void MessagePanel::scheduleFitColumns() {
    if (fitPending_)
        return;
    fitPending_ = true;
    QTimer::singleShot(0, this, [this] {
        fitPending_ = false;
        // Setting a section's (same) mode makes the header recompute its
        // automatic sections (QHeaderView::setSectionResizeMode).
        view_->horizontalHeader()->setSectionResizeMode(SeqColumn, QHeaderView::ResizeToContents);
        fitRowHeights();
    });
}

// Rows with a quote or reaction chips are taller (MessageDelegate's size);
// every other row keeps the table's default height.
void MessagePanel::fitRowHeights() {
    QStyleOptionViewItem opt;
    opt.initFrom(view_);
    const int plain = view_->verticalHeader()->defaultSectionSize();
    const QScrollBar *sb = view_->verticalScrollBar();
    const bool atBottom = sb->value() >= sb->maximum();
    bool changed = false;
    for (int r = 0; r < table_->rowCount(); ++r) {
        const int h = qMax(plain, delegate_->sizeHint(opt, table_->index(r, BodyColumn)).height());
        if (view_->rowHeight(r) != h) {
            view_->setRowHeight(r, h);
            changed = true;
        }
    }
    if (changed && atBottom)
        QTimer::singleShot(0, view_, &QTableView::scrollToBottom);
}

void MessagePanel::setSendEnabled(bool enabled) {
    sendButton_->setEnabled(enabled);
    sendEdit_->setEnabled(enabled);
}

void MessagePanel::updateHeader() {
    const int row = convs_->indexOf(conv_);
    if (conv_.isEmpty() || row < 0) {
        header_->setText(conv_.isEmpty() ? tr("No conversation selected")
                                                    : QStringLiteral("<b>%1</b>").arg(conv_.toHtmlEscaped()));
        return;
    }
    auto v = [&](int r) { return convs_->get(row, r); };
    QString text = QStringLiteral("<b>%1</b> (%2) &nbsp; head %3 &middot; read %4 &middot; delivered %5 &middot; "
                                  "unread %6 &middot; epoch %7")
                       .arg(conv_.toHtmlEscaped(), v(ConversationListModel::KindRole).toString())
                       .arg(v(ConversationListModel::HeadRole).toLongLong())
                       .arg(v(ConversationListModel::ReadRole).toLongLong())
                       .arg(v(ConversationListModel::DeliveredRole).toLongLong())
                       .arg(v(ConversationListModel::UnreadRole).toLongLong())
                       .arg(v(ConversationListModel::EpochRole).toLongLong());
    if (v(ConversationListModel::HasGapRole).toBool())
        text += QStringLiteral(" &middot; <span style='color:#b00000'>gap: events purged before this device saw them</span>");
    header_->setText(text);
}

void MessagePanel::sendTyped() {
    const QString text = sendEdit_->text();
    if (text.trimmed().isEmpty())
        return;
    if (conv_.isEmpty()) {
        emit statusMessage(tr("Pick a conversation first"), 5000);
        return;
    }
    const bool plain = actions_->mode() == MessageActions::Mode::Send;
    const bool edit = actions_->mode() == MessageActions::Mode::Edit;
    const QString cmid = plain ? client_->send(conv_, text) : actions_->submit(text);
    if (cmid.isEmpty()) {
        if (plain)
            emit statusMessage(tr("Not queued: %1").arg(client_->lastError()), 10000);
        return;
    }
    sendEdit_->clear();
    if (edit)
        return; // the edited row stays where the user is reading
    followTail_ = true;
    // Our message is the newest row: back to the newest window.
    msgs_->followNewest();
    QTimer::singleShot(0, view_, &QTableView::scrollToBottom);
    if (plain)
        emit statusMessage(tr("Queued %1 (durable; cmid %2)").arg(text.left(30), cmid), 5000);
}

void MessagePanel::showMessageMenu(const QPoint &pos) {
    const QModelIndex idx = view_->indexAt(pos);
    if (!idx.isValid())
        return;
    const QModelIndex src = table_->sourceIndex(idx.row());
    const qint64 seq = src.data(MessageListModel::SeqRole).toLongLong();
    const bool own = src.data(MessageListModel::IsOwnRole).toBool();
    const auto st = MessageState(src.data(MessageListModel::StateRole).toInt());
    const bool isMsg = src.data(MessageListModel::KindRole).toString() == QLatin1String("msg");
    const QString cmid = src.data(MessageListModel::CmidRole).toString();
    const QString conv = conv_;

    QMenu menu(this);
    menu.setObjectName(QStringLiteral("messageMenu"));
    QAction *recall = menu.addAction(seq > 0 ? tr("Recall (seq %1)").arg(seq) : tr("Recall"));
    recall->setObjectName(QStringLiteral("recallAction"));
    // Others' messages stay recallable on purpose: QA sees NOT_SENDER.
    recall->setEnabled(isMsg && seq > 0 && st == MessageState::Sent);
    if (!own)
        recall->setText(recall->text() + tr(" - not yours: expect NOT_SENDER"));
    connect(recall, &QAction::triggered, this, [this, conv, seq] {
        const QString rc = client_->recall(conv, seq);
        if (rc.isEmpty()) {
            emit statusMessage(tr("Recall not queued: %1").arg(client_->lastError()), 10000);
            return;
        }
        recallCmids_.insert(rc);
        emit statusMessage(tr("Recall of seq %1 queued (request %2)").arg(seq).arg(rc.left(8)), 10000);
    });
    QAction *cancel = menu.addAction(tr("Cancel (not sent yet)"));
    cancel->setObjectName(QStringLiteral("cancelAction"));
    cancel->setEnabled(own && !cmid.isEmpty() && st == MessageState::Pending);
    connect(cancel, &QAction::triggered, this, [this, cmid] { emit actionDone(cancelOutboxEntry(client_, cmid)); });
    QAction *discard = menu.addAction(tr("Discard"));
    discard->setObjectName(QStringLiteral("discardAction"));
    discard->setEnabled(!cmid.isEmpty() && (st == MessageState::Failed || st == MessageState::Expired));
    connect(discard, &QAction::triggered, this, [this, cmid] { emit actionDone(discardMessage(client_, cmid)); });
    addFileActions(&menu, src);
    QAction *copy = menu.addAction(tr("Copy cmid"));
    copy->setObjectName(QStringLiteral("copyCmidAction"));
    copy->setEnabled(!cmid.isEmpty());
    connect(copy, &QAction::triggered, this, [cmid] { QGuiApplication::clipboard()->setText(cmid); });
    actions_->addToMenu(&menu, src, conv);
    menu.exec(view_->viewport()->mapToGlobal(pos));
}

void MessagePanel::loadOlder() {
    if (!msgs_->canFetchMore()) {
        emit statusMessage(tr("Nothing older to load"), 5000);
        return;
    }
    msgs_->fetchMore();
    updateHistoryControls();
}

void MessagePanel::showMessage(qint64 seq) {
    jumpTo_ = seq;
    jumpLoads_ = 0;
    if (!tryJump())
        QTimer::singleShot(0, this, [this] { tryJump(); });
}

bool MessagePanel::tryJump() {
    if (jumpTo_ <= 0)
        return true;
    for (int r = 0; r < msgs_->rowCount(); ++r) {
        if (msgs_->get(r, MessageListModel::SeqRole).toLongLong() != jumpTo_)
            continue;
        const int viewRow = order_->mapFromSource(msgs_->index(r, 0)).row();
        view_->selectRow(viewRow);
        view_->scrollTo(table_->index(viewRow, BodyColumn), QAbstractItemView::PositionAtCenter);
        jumpTo_ = 0;
        return true;
    }
    // Not in the window: older rows (from the store, else the server).
    if (msgs_->canFetchMore() && jumpLoads_ < 50) {
        ++jumpLoads_;
        msgs_->fetchMore();
    } else if (!msgs_->isLoadingOlder()) {
        emit statusMessage(tr("Message #%1 is not in this conversation's loaded history").arg(jumpTo_), 8000);
        jumpTo_ = 0;
        return true;
    }
    QTimer::singleShot(50, this, [this] { tryJump(); });
    return false;
}

qint64 MessagePanel::selectedSeq() const {
    const QModelIndex cur = view_->currentIndex();
    return cur.isValid() ? msgs_->get(modelRow(cur.row()), MessageListModel::SeqRole).toLongLong() : 0;
}

int MessagePanel::modelRow(int viewRow) const {
    return order_->mapToSource(order_->index(viewRow, 0)).row();
}

void MessagePanel::onUserScrolled(bool top, bool bottom) {
    if (top && msgs_->canFetchMore())
        loadOlder(); // the oldest row is at the top
    else if (bottom && !msgs_->isFollowingNewest())
        msgs_->followNewest(); // back at the newest row: drop the older rows again
}

void MessagePanel::fillSelectedGap() {
    int row = -1;
    const QModelIndex cur = view_->currentIndex();
    if (cur.isValid() && msgs_->get(modelRow(cur.row()), MessageListModel::KindRole).toString() == QLatin1String("gap"))
        row = modelRow(cur.row());
    for (int r = 0; row < 0 && r < msgs_->rowCount(); ++r) // newest first: the newest gap
        if (msgs_->get(r, MessageListModel::KindRole).toString() == QLatin1String("gap"))
            row = r;
    if (row < 0) {
        emit statusMessage(tr("No gap in this view"), 5000);
        return;
    }
    const qint64 from = msgs_->get(row, MessageListModel::GapFromRole).toLongLong();
    const qint64 to = msgs_->get(row, MessageListModel::GapToRole).toLongLong();
    const bool ok = msgs_->fillGap(row);
    emit statusMessage(ok ? tr("Loading the newest events of gap %1-%2").arg(from).arg(to)
                                : tr("Gap %1-%2 not filled (offline or already loading)").arg(from).arg(to),
                             5000);
}

void MessagePanel::updateHistoryControls() {
    int gaps = 0;
    for (int r = 0; r < msgs_->rowCount(); ++r)
        if (msgs_->get(r, MessageListModel::KindRole).toString() == QLatin1String("gap"))
            ++gaps;
    loadOlderButton_->setEnabled(msgs_->canFetchMore());
    fillGapButton_->setEnabled(gaps > 0);
    historyLabel_->setText(msgs_->isLoadingOlder() ? tr("loading older...")
                                                   : tr("%1 rows, %2 gap(s)%3")
                                                         .arg(msgs_->rowCount())
                                                         .arg(gaps)
                                                         .arg(msgs_->canFetchMore() ? tr(", older exist")
                                                                                    : QString()));
}

void MessagePanel::scheduleReadMarker() {
    if (!readTimer_->isActive())
        readTimer_->start();
}

// Marks read up to the newest message the user can see in the view: the
// timeline is newest first, so the rows inside the viewport, the newest on top.
void MessagePanel::advanceReadMarker() {
    if (conv_.isEmpty() || !window()->isVisible() || window()->isMinimized() || msgs_->conversation() != conv_)
        return;
    const int rows = table_->rowCount();
    if (rows == 0)
        return;
    const int first = std::max(0, view_->rowAt(0));
    int last = view_->rowAt(view_->viewport()->height() - 1);
    if (last < 0)
        last = rows - 1;
    qint64 seq = 0;
    for (int r = first; r <= last && r < rows; ++r)
        seq = qMax(seq, msgs_->get(modelRow(r), MessageListModel::SeqRole).toLongLong());
    const int crow = convs_->indexOf(conv_);
    // The bottom (newest) row is in view: everything applied so far has been
    // seen, including events that are not rows (recalls).
    if (last >= rows - 1 && crow >= 0)
        seq = qMax(seq, convs_->get(crow, ConversationListModel::CursorRole).toLongLong());
    if (seq <= 0)
        return;
    const qint64 read = crow >= 0 ? convs_->get(crow, ConversationListModel::ReadRole).toLongLong() : 0;
    if (seq <= read || seq <= readRequested_.value(conv_))
        return;
    if (client_->markRead(conv_, seq))
        readRequested_.insert(conv_, seq);
}

// --- files (obligation 17; docs/demo-app.md "Files") ---------------------

QString MessagePanel::fileText(const QModelIndex &s) {
    const QVariantList files = s.data(MessageListModel::AttachmentsRole).toList();
    if (files.isEmpty())
        return {};
    QStringList parts;
    for (const QVariant &v : files) {
        const QVariantMap f = v.toMap();
        const qint64 size = f.value(QStringLiteral("size")).toLongLong();
        QString t = QStringLiteral("%1 (%2)").arg(f.value(QStringLiteral("name")).toString(),
                                                  QLocale().formattedDataSize(size));
        const QString state = f.value(QStringLiteral("downloadState")).toString();
        if (state == QLatin1String("downloading") && size > 0)
            t += QStringLiteral(" download %1%").arg(f.value(QStringLiteral("received")).toLongLong() * 100 / size);
        else if (state == QLatin1String("done"))
            t += QStringLiteral(" saved");
        else if (state == QLatin1String("failed"))
            t += QStringLiteral(" download failed: %1").arg(f.value(QStringLiteral("errorCode")).toString());
        parts << t;
    }
    const double up = s.data(MessageListModel::UploadProgressRole).toDouble();
    if (up >= 0)
        parts << QStringLiteral("upload %1%").arg(int(up * 100));
    return parts.join(QStringLiteral("; "));
}

QString MessagePanel::attachFile(const QString &path) {
    if (conv_.isEmpty()) {
        emit statusMessage(tr("Pick a conversation first"), 5000);
        return {};
    }
    const QString cmid = client_->sendFile(conv_, path, sendEdit_->text());
    if (cmid.isEmpty()) {
        emit statusMessage(tr("File not queued: %1").arg(client_->lastError()), 10000);
        return {};
    }
    sendEdit_->clear();
    followTail_ = true;
    msgs_->followNewest();
    QTimer::singleShot(0, view_, &QTableView::scrollToBottom);
    emit statusMessage(tr("Queued %1 (copied into the store; cmid %2)").arg(QFileInfo(path).fileName(), cmid), 5000);
    return cmid;
}

QString MessagePanel::saveAttachment(const QString &attId, const QString &path) {
    if (!downloadsWired_) {
        downloadsWired_ = true;
        connect(client_, &im::Client::downloadFinished, this, [this](const QString &, const QString &to) {
            emit statusMessage(tr("Saved %1").arg(to), 10000);
            if (openWhenDone_.remove(to))
                QDesktopServices::openUrl(QUrl::fromLocalFile(to));
        });
        connect(client_, &im::Client::downloadFailed, this,
                [this](const QString &att, im::Error, const QString &code, const QString &message) {
                    emit statusMessage(tr("Download of %1 failed: %2 %3").arg(att, code, message), 15000);
                });
    }
    const QString id = client_->download(attId, path);
    if (id.isEmpty())
        emit statusMessage(tr("Not downloaded: %1").arg(client_->lastError()), 10000);
    return id;
}

void MessagePanel::addFileActions(QMenu *menu, const QModelIndex &src) {
    const QVariantList files = src.data(MessageListModel::AttachmentsRole).toList();
    const QVariantMap f = files.value(0).toMap();
    const QString attId = f.value(QStringLiteral("id")).toString();
    const QString name = f.value(QStringLiteral("name")).toString();
    QAction *save = menu->addAction(name.isEmpty() ? tr("Save file...") : tr("Save %1...").arg(name));
    save->setObjectName(QStringLiteral("saveFileAction"));
    save->setEnabled(!attId.isEmpty());
    connect(save, &QAction::triggered, this, [this, attId, name] {
        const QString to = QFileDialog::getSaveFileName(
            this, tr("Save file"),
            QStandardPaths::writableLocation(QStandardPaths::DownloadLocation) + u'/' + name);
        if (!to.isEmpty())
            saveAttachment(attId, to);
    });
    QAction *open = menu->addAction(tr("Open file"));
    open->setObjectName(QStringLiteral("openFileAction"));
    open->setEnabled(!attId.isEmpty());
    connect(open, &QAction::triggered, this, [this, attId, name] {
        const QString dir = QStandardPaths::writableLocation(QStandardPaths::TempLocation) + QStringLiteral("/imdemo-files");
        QDir().mkpath(dir);
        const QString to = dir + u'/' + (name.isEmpty() ? attId : name);
        openWhenDone_.insert(to);
        saveAttachment(attId, to);
    });
}

void MessagePanel::dragEnterEvent(QDragEnterEvent *e) {
    for (const QUrl &u : e->mimeData()->urls())
        if (u.isLocalFile()) {
            e->acceptProposedAction();
            return;
        }
}

void MessagePanel::dropEvent(QDropEvent *e) {
    for (const QUrl &u : e->mimeData()->urls())
        if (u.isLocalFile())
            attachFile(u.toLocalFile());
    e->acceptProposedAction();
}
