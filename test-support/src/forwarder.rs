//! A TCP forwarder on a loopback port of its own: every connection to it is relayed to a target, so one
//! server can appear at as many addresses as a test needs (replicas coming and going under new endpoints).
//! Dropping it stops accepting and closes the connections it relays.

use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::free_port;

#[derive(Debug)]
pub struct Forwarder {
    pub addr: SocketAddr,
    pub target: SocketAddr,
    stopping: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl Forwarder {
    /// Listens on a fresh loopback port and relays every connection to `target`.
    pub fn start(target: SocketAddr) -> Forwarder {
        let listener = TcpListener::bind(("127.0.0.1", free_port())).expect("bind a forwarder port");
        let addr = listener.local_addr().expect("the forwarder's address");
        let stopping = Arc::new(AtomicBool::new(false));
        let connections: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let acceptor = {
            let (stopping, connections) = (stopping.clone(), connections.clone());
            std::thread::spawn(move || accept(listener, target, &stopping, &connections))
        };
        Forwarder { addr, target, stopping, connections, acceptor: Some(acceptor) }
    }
}

fn accept(listener: TcpListener, target: SocketAddr, stopping: &AtomicBool, connections: &Mutex<Vec<TcpStream>>) {
    for client in listener.incoming() {
        if stopping.load(Ordering::Acquire) {
            return;
        }
        let Ok(client) = client else { continue };
        let Ok(server) = TcpStream::connect(target) else { continue };
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        let (Ok(client_read), Ok(server_read)) = (client.try_clone(), server.try_clone()) else { continue };
        if let Ok(mut open) = connections.lock() {
            open.extend(client.try_clone().ok());
            open.extend(server.try_clone().ok());
        }
        std::thread::spawn(move || relay(client_read, server));
        std::thread::spawn(move || relay(server_read, client));
    }
}

/// Copies `from` into `to` until either side closes, then closes both directions.
fn relay(mut from: TcpStream, mut to: TcpStream) {
    match std::io::copy(&mut from, &mut to) {
        Ok(_) => {}
        Err(error) if error.kind() == ErrorKind::NotConnected => {}
        Err(_) => {}
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        // Wakes the acceptor, which then sees `stopping`.
        let _ = TcpStream::connect(self.addr);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        if let Ok(open) = self.connections.lock() {
            for stream in open.iter() {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}
