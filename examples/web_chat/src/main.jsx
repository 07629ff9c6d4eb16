// The chat page: the AI SDK's useChat against threadline.web, mounted at /api.
// The chat id lives in localStorage, so a reload finds the same session; useChat's
// `resume: true` then rejoins the answer that is still streaming.
import { useChat } from "@ai-sdk/react";
import { DefaultChatTransport } from "ai";
import { useEffect, useMemo, useState } from "react";
import { createRoot } from "react-dom/client";

const API = "/api/chat";

function chatId() {
  let id = localStorage.getItem("threadline-chat");
  if (!id) {
    const user = document.getElementById("root").dataset.user;
    id = `${user}:${crypto.randomUUID()}`;
    localStorage.setItem("threadline-chat", id);
  }
  return id;
}

function text(message) {
  return message.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
}

function Chat({ id, initial }) {
  const transport = useMemo(() => new DefaultChatTransport({
    api: API,
    // The server keeps the conversation: send it only the new message.
    prepareSendMessagesRequest: ({ id, messages }) => ({
      body: { id, message: messages[messages.length - 1] },
    }),
  }), []);
  const { messages, sendMessage, status, stop, error } = useChat({
    id, messages: initial, transport, resume: true,
  });
  const [input, setInput] = useState("");
  const busy = status === "submitted" || status === "streaming";
  const onStop = async () => {
    // Stop is the server's decision, stored; useChat's stop only drops our connection.
    await fetch(`${API}/${encodeURIComponent(id)}/stop`, { method: "POST" });
    stop();
  };
  return (
    <div>
      <div id="messages">
        {messages.map((m) => (
          <div key={m.id} data-id={m.id} data-role={m.role}
               className={`msg ${m.role} ${m.metadata?.threadline?.stopReason === "stopped" ? "aborted" : ""}`}>
            {text(m)}
          </div>
        ))}
      </div>
      <p id="status" data-status={status}>{status}{error ? `: ${error.message}` : ""}</p>
      <form onSubmit={(e) => {
        e.preventDefault();
        if (!input.trim()) return;
        sendMessage({ text: input });
        setInput("");
      }}>
        <input id="input" value={input} onChange={(e) => setInput(e.target.value)}
               placeholder="Say something" autoFocus />
        <button id="send" type="submit" disabled={busy}>Send</button>
        <button id="stop" type="button" onClick={onStop} disabled={!busy}>Stop</button>
      </form>
    </div>
  );
}

function App() {
  const id = useMemo(chatId, []);
  const [initial, setInitial] = useState(null);
  useEffect(() => {
    fetch(`${API}/${encodeURIComponent(id)}/messages`)
      .then((r) => (r.ok ? r.json() : { messages: [] }))
      .then((body) => setInitial(body.messages));
  }, [id]);
  return initial === null ? <p>Loading…</p> : <Chat id={id} initial={initial} />;
}

createRoot(document.getElementById("root")).render(<App />);
